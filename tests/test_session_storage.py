"""Session storage: state.json (atomic), ledger.jsonl (append-only, crash-safe), manifest.json."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from inferloom.session import atomic
from inferloom.session.ledger import (
    KINDS,
    LEDGER_FILE,
    MEASUREMENT,
    PHASE,
    Ledger,
    LedgerError,
    read_entries,
)
from inferloom.session.manifest import (
    ManifestError,
    build_manifest,
    read_manifest,
    run_env,
    write_manifest,
)
from inferloom.session.state import (
    STATE_FILE,
    STATE_SCHEMA_VERSION,
    Budget,
    PendingAction,
    Phase,
    SessionState,
    StateError,
    load_state,
    new_session_id,
    save_state,
)
from inferloom.spec import load_spec, spec_hash


def _state(**kw) -> SessionState:
    base = dict(
        session_id=new_session_id(),
        budget=Budget(minutes=10, trials=20),
        stock_config={"cache_implementation": "dynamic", "compile": False},
    )
    base.update(kw)
    return SessionState(**base)


# --------------------------------------------------------------------------- state


def test_state_round_trip(tmp_path):
    s = _state(
        phase=Phase.FRAMEWORK,
        cycle=2,
        stack={"cache_implementation": "static", "compile": True},
        noise_floor={"sd_log_ratio": 0.01, "ci_half_width_pct": 0.8},
        measured_config_keys=["a=1", "a=2"],
        pending_action=PendingAction(action="measure_candidate", params={"a": 2}, key="c1-t3"),
        last_ledger_seq=17,
    )
    s.used.elapsed_s = 12.5
    s.used.trials = 3
    save_state(tmp_path, s)
    back = load_state(tmp_path)
    assert back == s
    assert back.phase is Phase.FRAMEWORK
    assert back.pending_action.key == "c1-t3"
    raw = json.loads((tmp_path / STATE_FILE).read_text())
    assert raw["schema_version"] == STATE_SCHEMA_VERSION
    assert raw["phase"] == "FRAMEWORK"
    assert sorted(os.listdir(tmp_path)) == [STATE_FILE]


def test_state_save_is_atomic_when_dump_fails_mid_write(tmp_path, monkeypatch):
    first = _state(cycle=1)
    save_state(tmp_path, first)
    before = (tmp_path / STATE_FILE).read_bytes()

    real_dump = json.dump

    def dying_dump(obj, fp, **kw):
        fp.write('{"schema_version": 1, "session_id": "half-writ')
        fp.flush()
        raise OSError("simulated crash mid-write")

    monkeypatch.setattr(atomic.json, "dump", dying_dump)
    with pytest.raises(OSError, match="simulated crash"):
        save_state(tmp_path, _state(cycle=2))
    monkeypatch.setattr(atomic.json, "dump", real_dump)

    assert (tmp_path / STATE_FILE).read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == [STATE_FILE]  # no temp file left
    assert load_state(tmp_path).cycle == 1


def test_stale_temp_from_a_killed_save_is_ignored_then_removed(tmp_path):
    save_state(tmp_path, _state())
    stale = tmp_path / ".state.json.abc123.tmp"
    stale.write_text('{"schema_ver')
    assert load_state(tmp_path).schema_version == STATE_SCHEMA_VERSION
    save_state(tmp_path, _state())
    assert not stale.exists()


def test_state_rejects_non_finite_numbers_before_touching_the_file(tmp_path):
    save_state(tmp_path, _state())
    before = (tmp_path / STATE_FILE).read_bytes()
    with pytest.raises(ValueError):
        save_state(tmp_path, _state(noise_floor={"sd": float("nan")}))
    assert (tmp_path / STATE_FILE).read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == [STATE_FILE]


def test_newer_schema_is_refused_with_a_clear_message(tmp_path):
    save_state(tmp_path, _state())
    raw = json.loads((tmp_path / STATE_FILE).read_text())
    raw["schema_version"] = STATE_SCHEMA_VERSION + 1
    (tmp_path / STATE_FILE).write_text(json.dumps(raw))
    with pytest.raises(StateError) as err:
        load_state(tmp_path)
    msg = str(err.value)
    assert "newer inferloom" in msg and "upgrade inferloom" in msg
    assert str(STATE_SCHEMA_VERSION + 1) in msg and "\n" not in msg


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "not found"),
        ('{"schema_version": 1, "sess', "not valid JSON"),
        (b"\xff\xfe\x00", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"session_id": "x"}', "'schema_version' missing"),
        ('{"schema_version": 0}', "older"),
        ('{"schema_version": 1, "session_id": "x"}', "field 'budget'"),
        (
            '{"schema_version": 1, "session_id": "x", "budget": {"minutes": 1, "trials": 1},'
            ' "phase": "WARP"}',
            "field 'phase'",
        ),
    ],
)
def test_bad_state_files_give_one_line_errors(tmp_path, content, expected):
    if content is not None:
        path = tmp_path / STATE_FILE
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(StateError) as err:
        load_state(tmp_path)
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_state_validates_assignments():
    s = _state()
    with pytest.raises(Exception):
        s.cycle = -1
    with pytest.raises(Exception):
        s.phase = "WARP"


# --------------------------------------------------------------------------- ledger


def test_ledger_seq_is_monotonic_across_reopen(tmp_path):
    with Ledger(tmp_path) as led:
        assert led.last_seq == 0 and not led.recovered_torn_line
        assert led.append(PHASE, {"to": "PRELUDE"}) == 1
        assert led.append(MEASUREMENT, {"runs": [1, 2]}) == 2
    with Ledger(tmp_path) as led:
        assert led.last_seq == 2
        assert led.append(PHASE, {"to": "FRAMEWORK"}) == 3
        entries = led.entries()
        assert [e["seq"] for e in entries] == [1, 2, 3]
        assert [e["kind"] for e in entries] == [PHASE, MEASUREMENT, PHASE]
        assert [e["seq"] for e in led.entries(PHASE)] == [1, 3]
        assert entries[1]["runs"] == [1, 2] and isinstance(entries[1]["ts"], float)
    assert [e["seq"] for e in read_entries(tmp_path, MEASUREMENT)] == [2]
    lines = (tmp_path / LEDGER_FILE).read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 4


def test_ledger_recovers_a_torn_last_line(tmp_path):
    with Ledger(tmp_path) as led:
        led.append(PHASE, {"to": "PRELUDE"})
        led.append(MEASUREMENT, {"x": 1})
    good = (tmp_path / LEDGER_FILE).read_bytes()
    torn = b'{"seq":3,"ts":1.0,"kind":"measurement","runs":[1,2'
    (tmp_path / LEDGER_FILE).write_bytes(good + torn)
    # a reader tolerates it without touching the file
    assert [e["seq"] for e in read_entries(tmp_path)] == [1, 2]
    assert (tmp_path / LEDGER_FILE).read_bytes() == good + torn
    with Ledger(tmp_path) as led:
        assert led.recovered_torn_line is True
        assert led.torn_bytes == torn
        assert (tmp_path / LEDGER_FILE).read_bytes() == good
        assert led.last_seq == 2
        assert led.append(MEASUREMENT, {"x": 3}) == 3
        assert [e["seq"] for e in led.entries()] == [1, 2, 3]
    with Ledger(tmp_path) as led:
        assert led.recovered_torn_line is False and led.torn_bytes == b""


def test_ledger_treats_an_unparseable_newline_terminated_last_line_as_torn(tmp_path):
    with Ledger(tmp_path) as led:
        led.append(PHASE, {"to": "PRELUDE"})
    good = (tmp_path / LEDGER_FILE).read_bytes()
    (tmp_path / LEDGER_FILE).write_bytes(good + b"\x00\x00\x00\n")
    with Ledger(tmp_path) as led:
        assert led.recovered_torn_line and led.last_seq == 1
    assert (tmp_path / LEDGER_FILE).read_bytes() == good


def test_ledger_corrupt_middle_line_raises(tmp_path):
    with Ledger(tmp_path) as led:
        for i in range(3):
            led.append(MEASUREMENT, {"i": i})
    lines = (tmp_path / LEDGER_FILE).read_bytes().split(b"\n")
    lines[1] = lines[1][:10]
    (tmp_path / LEDGER_FILE).write_bytes(b"\n".join(lines))
    with pytest.raises(LedgerError, match="line 2"):
        Ledger(tmp_path)
    with pytest.raises(LedgerError, match="line 2"):
        read_entries(tmp_path)


def test_ledger_seq_gap_is_corruption(tmp_path):
    with Ledger(tmp_path) as led:
        for i in range(3):
            led.append(MEASUREMENT, {"i": i})
    lines = (tmp_path / LEDGER_FILE).read_bytes().split(b"\n")
    del lines[1]
    (tmp_path / LEDGER_FILE).write_bytes(b"\n".join(lines))
    with pytest.raises(LedgerError, match="expected 2"):
        Ledger(tmp_path)


def test_ledger_idempotency_key_prevents_duplicates_across_reopen(tmp_path):
    with Ledger(tmp_path) as led:
        assert led.append(MEASUREMENT, {"v": 1}, key="cycle1-trial1") == 1
        assert led.append(MEASUREMENT, {"v": 999}, key="cycle1-trial1") == 1
        assert led.append(PHASE, {"to": "CLOSE"}) == 2
    with Ledger(tmp_path) as led:
        assert led.has_key("cycle1-trial1")
        assert led.append(MEASUREMENT, {"v": 2}, key="cycle1-trial1") == 1
        assert led.find("cycle1-trial1")["v"] == 1
        assert led.find("nope") is None
        assert led.append(MEASUREMENT, {"v": 3}, key="cycle1-trial2") == 3
        with pytest.raises(LedgerError, match="already used"):
            led.append(PHASE, {}, key="cycle1-trial2")
        assert led.last_seq == 3
    assert [e.get("key") for e in read_entries(tmp_path)] == ["cycle1-trial1", None, "cycle1-trial2"]


def test_ledger_rejects_bad_payloads_without_writing(tmp_path):
    with Ledger(tmp_path) as led:
        led.append(PHASE, {"to": "PRELUDE"})
        size = (tmp_path / LEDGER_FILE).stat().st_size
        with pytest.raises(LedgerError, match="reserved"):
            led.append(MEASUREMENT, {"seq": 5})
        with pytest.raises(LedgerError, match="JSON"):
            led.append(MEASUREMENT, {"x": float("inf")})
        with pytest.raises(LedgerError, match="JSON"):
            led.append(MEASUREMENT, {"x": object()})
        assert (tmp_path / LEDGER_FILE).stat().st_size == size
        assert led.append(MEASUREMENT, {"x": "ünïcode"}) == 2
    assert read_entries(tmp_path)[1]["x"] == "ünïcode"


def test_ledger_one_writer_at_a_time(tmp_path):
    led = Ledger(tmp_path)
    with pytest.raises(LedgerError, match="another writer"):
        Ledger(tmp_path)
    led.close()
    with pytest.raises(LedgerError, match="closed"):
        led.append(PHASE, {})
    with Ledger(tmp_path) as again:
        assert again.last_seq == 0


def test_ledger_failed_write_is_rolled_back(tmp_path, monkeypatch):
    from inferloom.session import ledger as ledger_mod

    with Ledger(tmp_path) as led:
        led.append(PHASE, {"to": "PRELUDE"})
        good = (tmp_path / LEDGER_FILE).read_bytes()
        real_write = os.write

        def half_write(fd, data):
            real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(ledger_mod.os, "write", half_write)
        with pytest.raises(LedgerError, match="nothing was recorded"):
            led.append(MEASUREMENT, {"blob": "x" * 1000})
        monkeypatch.setattr(ledger_mod.os, "write", real_write)
        assert (tmp_path / LEDGER_FILE).read_bytes() == good
        assert led.append(MEASUREMENT, {"ok": True}) == 2
    assert [e["seq"] for e in read_entries(tmp_path)] == [1, 2]


def test_kind_constants():
    assert set(KINDS) == {
        "measurement", "proposal", "verdict", "refusal", "phase",
        "agent_io", "enablement_rung", "error", "close", "server_start",
    }


_CHILD = textwrap.dedent(
    """
    import random, sys
    from inferloom.session.ledger import Ledger
    from inferloom.session.state import Budget, SessionState, save_state, load_state

    d = sys.argv[1]
    rng = random.Random(int(sys.argv[2]))
    if sys.argv[3] == "slow":
        # a slow disk: each append reaches the file in small pieces, so the
        # kill usually lands in the middle of a line
        import os, time
        real_write = os.write

        def slow_write(fd, data):
            time.sleep(0.002)
            return real_write(fd, bytes(data[:4096]))

        os.write = slow_write
    led = Ledger(d)
    try:
        state = load_state(d)
    except Exception:
        state = SessionState(session_id="crash", budget=Budget(minutes=1, trials=1))
    print("ready", flush=True)
    i = 0
    while True:
        blob = "x" * rng.randrange(1, 300_000)
        seq = led.append("measurement", {"i": i, "blob": blob}, key=f"step-{i}")
        if seq > state.last_ledger_seq:  # a re-issued step (resume) writes nothing
            state.last_ledger_seq = seq
            save_state(d, state)
        print(i, seq, flush=True)
        i += 1
    """
)


def test_ledger_and_state_survive_sigkill(tmp_path):
    """Real crashes: a writer appending (and saving state) is SIGKILLed at a random
    moment, again and again; each restart re-issues its steps from the start with
    the same idempotency keys, as a resumed coordinator does."""
    rng = random.Random(1234)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.monotonic()
    acknowledged: dict[int, int] = {}  # i -> seq the child got back from append
    runs = torn_recoveries = 0
    # at least 5 kills; go on (up to 10) until one has torn a line for real
    while runs < 5 or (torn_recoveries == 0 and runs < 10):
        mode = "slow" if runs % 2 == 0 else "fast"
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(tmp_path), str(runs), mode],
            stdout=subprocess.PIPE, text=True, env=env,
        )
        runs += 1
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.4))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=10)
        assert proc.returncode == -signal.SIGKILL
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2:  # a line cut by the kill is not an acknowledgement
                i, seq = int(parts[0]), int(parts[1])
                assert acknowledged.setdefault(i, seq) == seq  # re-issued step: same seq

        raw_before = (tmp_path / LEDGER_FILE).read_bytes()
        with Ledger(tmp_path) as led:
            entries = led.entries()
            if led.recovered_torn_line:
                torn_recoveries += 1
                assert raw_before.endswith(led.torn_bytes) and led.torn_bytes
            else:
                assert raw_before == b"" or raw_before.endswith(b"\n")
        raw = (tmp_path / LEDGER_FILE).read_bytes()
        assert raw == b"" or raw.endswith(b"\n")  # nothing torn kept
        assert raw.count(b"\n") == len(entries)
        assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1))
        assert [e["key"] for e in entries] == [f"step-{k}" for k in range(len(entries))]
        for i, seq in acknowledged.items():  # nothing acknowledged was lost
            assert entries[seq - 1]["i"] == i
        state = load_state(tmp_path)  # never half-written
        assert state.last_ledger_seq <= len(entries)
    assert acknowledged, "the child never completed an append"
    assert torn_recoveries >= 1, "no kill landed mid-line: the torn-line path was not exercised"
    assert time.monotonic() - t0 < 20


# --------------------------------------------------------------------------- manifest


def test_manifest_has_the_required_fields(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    monkeypatch.setenv("INFERLOOM_API_TOKEN", "hunter2")
    monkeypatch.setenv("TORCHINDUCTOR_MAX_AUTOTUNE", "1")
    spec = load_spec(overrides={"device": "cpu", "seed": 7})
    desc = {"framework": "transformers", "model": "llama-tiny", "device": "cpu"}
    seeds = {"spec_seed": 7, "bootstrap_seed": 12345, "search_seed": 1}
    m = build_manifest(spec, desc, seeds)
    assert m["schema_version"] >= 1
    assert m["inferloom"]["version"] and m["inferloom"]["git_revision"]
    for mod in ("python", "torch", "transformers"):
        assert mod in m["versions"]
    assert m["versions"]["python"]
    assert m["device"]["name"] and "driver" in m["device"]
    assert m["spec"] == spec.to_dict() and m["spec_hash"] == spec_hash(spec)
    assert m["seeds"] == seeds and m["adapter"] == desc
    assert m["env"]["OMP_NUM_THREADS"] == "4"
    assert m["env"]["TORCHINDUCTOR_MAX_AUTOTUNE"] == "1"
    assert "INFERLOOM_API_TOKEN" not in m["env"]

    write_manifest(tmp_path, m)
    assert read_manifest(tmp_path) == json.loads(json.dumps(m))
    assert sorted(os.listdir(tmp_path)) == ["manifest.json"]


def test_manifest_read_errors(tmp_path):
    with pytest.raises(ManifestError, match="not found"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text('{"schema_version": 99}')
    with pytest.raises(ManifestError, match="newer inferloom"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text('{"schema_ver')
    with pytest.raises(ManifestError, match="not valid JSON"):
        read_manifest(tmp_path)


def test_run_env_filters_credentials():
    env = {"CUDA_VISIBLE_DEVICES": "0", "HF_TOKEN": "x", "NCCL_AUTH_SECRET": "y", "HOME": "/root"}
    assert run_env(env) == {"CUDA_VISIBLE_DEVICES": "0"}


def test_run_env_records_the_serving_engines_own_variables():
    # a server inherits the session's environment: what the engine reads from it is part of what ran
    env = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "SGLANG_LOG_MS": "1", "FLASHINFER_WORKSPACE_BASE": "/tmp/fi",
           "VLLM_API_KEY": "secret", "HOME": "/root"}
    assert run_env(env) == {"FLASHINFER_WORKSPACE_BASE": "/tmp/fi", "SGLANG_LOG_MS": "1",
                            "VLLM_USE_FLASHINFER_SAMPLER": "0"}
