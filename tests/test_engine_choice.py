"""`inferloom engines`: the refusal rules, the side-by-side table and the decision, on small closed sessions of the
deterministic synthetic adapter (fast; the real two-engine test is tests/test_engine_choice_real.py)."""

import dataclasses
import json
import math
import shutil

import pytest

from inferloom import cli
from inferloom.agents.rules import RuleCritic, RuleOrchestrator, RuleRobustness
from inferloom.engine_choice import engine_decision, read_session
from inferloom.engine_choice.sessions import check_comparable, machine_difference, workload_difference
from inferloom.measure.protocol import ProtocolSettings, decision_at
from inferloom.phases.runner import start
from inferloom.spec import load_spec
from inferloom.workloads.synthetic import SyntheticAdapter

BASE = {"model": "llama-tiny", "framework": "synthetic", "device": "cpu", "protocol.bootstrap_resamples": 999,
        "quality.eval_prompts": 4, "quality.heldout_prompts": 4, "quality.prompt_len": 8,
        "quality.continuation_len": 8}


def _agents():
    return {"orchestrator": RuleOrchestrator(seed=0), "critic_factory": RuleCritic, "robustness": RuleRobustness()}


def _session(d, max_trials, **over):
    spec = load_spec(None, {**BASE, **over})
    start(d, spec, budget_minutes=10, max_trials=max_trials, adapter=SyntheticAdapter(seed=spec.seed),
          agents=_agents(), sweep=False)
    return d


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """Closed sessions of one workload: a tuned one, a shorter one (one trial; it reaches the same final stack),
    and one with fast_path pinned off (a final stack without the synthetic +15% of fast_path)."""
    root = tmp_path_factory.mktemp("engines")
    return (_session(root / "tuned", 6), _session(root / "short", 1),
            _session(root / "no-fast-path", 6, pinned={"fast_path": False}))


def _edit_manifest(src, dst, edit):
    shutil.copytree(src, dst)
    m = json.loads((dst / "manifest.json").read_text())
    edit(m)
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


def _state_phase(src, dst, phase):
    shutil.copytree(src, dst)
    st = json.loads((dst / "state.json").read_text())
    st["phase"] = phase
    (dst / "state.json").write_text(json.dumps(st))
    return dst


def test_the_table_row_is_each_session_s_own_record(two):
    tuned = read_session(two[0])
    b = json.loads((two[0] / "session_breakdown.json").read_text())
    r = tuned.row()
    assert r["stock_median"] == b["stock"]["objective_median"] and r["stock_seq"] == b["stock"]["ledger_seq"]
    assert r["final_changes"] and r["final_ratio"] == b["final"]["ratio"] > 1.0
    assert r["final_ci"] == [b["final"]["ci_low"], b["final"]["ci_high"]] and r["final_seq"] == b["final"]["ledger_seq"]
    assert r["quality_passed"] is b["final"]["quality_passed"]
    assert r["precision"] == "float32 weights and activations"  # no stack_precision: the spec's dtype


@pytest.mark.parametrize("edit,named", [
    (lambda m: m["spec"]["traffic"].update(concurrency=16), "traffic.concurrency"),
    (lambda m: m["spec"].update(model="llama-3.1-8b"), "model"),
    (lambda m: m["spec"].update(device="cuda"), "device"),
], ids=["traffic", "model", "device"])
def test_not_one_workload_is_refused_naming_the_field(two, tmp_path, edit, named):
    other = _edit_manifest(two[1], tmp_path / "other", edit)
    why = workload_difference(read_session(two[0]), read_session(other))
    assert why is not None and why.startswith(named)
    out = tmp_path / "out"
    rc = cli.main(["engines", str(two[0]), str(other), "--out", str(out), "--quiet"])
    assert rc == 2 and not out.exists()


def test_the_objective_and_its_slos_must_match(two):
    a, b = read_session(two[0]), read_session(two[1])
    serving = b.spec.serving.model_copy(update={"slo_ttft_ms": 100.0})
    other = dataclasses.replace(b, spec=b.spec.model_copy(update={"objective": "goodput", "serving": serving}))
    assert workload_difference(a, other).startswith("objective differs: 'output_tokens_per_s'")
    a2 = dataclasses.replace(a, spec=other.spec.model_copy(update={"serving": b.spec.serving.model_copy(
        update={"slo_ttft_ms": 200.0})}))
    assert workload_difference(a2, other).startswith("serving.slo_ttft_ms differs: 200.0")


def test_requests_per_run_must_match(two, tmp_path):
    other = _edit_manifest(two[1], tmp_path / "other", lambda m: m["spec"]["traffic"].update(num_prompts=7))
    assert "traffic.num_prompts" in workload_difference(read_session(two[0]), read_session(other))


@pytest.mark.parametrize("key,value,named", [
    ("hostname", "another-host", "host"), ("name", "NVIDIA H200", "device"), ("created_at", 86400.0 * 3, "day")])
def test_not_one_machine_and_day_is_refused_naming_the_field(two, tmp_path, capsys, key, value, named):
    def edit(m):
        if key == "created_at":
            m["created_at"] = value
        else:
            m["device"][key] = value
    other = _edit_manifest(two[1], tmp_path / "other", edit)
    assert machine_difference(read_session(two[0]), read_session(other)).startswith(named)
    out = tmp_path / "out"
    rc = cli.main(["engines", str(two[0]), str(other), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert len(err.strip().splitlines()) == 1 and "not from one machine and day" in err and named in err


def test_an_unclosed_session_one_session_or_the_same_twice_is_refused(two, tmp_path, capsys):
    running = _state_phase(two[1], tmp_path / "running", "FRAMEWORK")
    out = tmp_path / "out"
    for args, said in (([two[0], running], "is not closed"), ([two[0]], "exactly two"),
                       ([two[0], two[0]], "same session"), ([two[0], two[1], running], "exactly two"),
                       ([two[0], tmp_path / "nothing"], "not a directory")):
        rc = cli.main(["engines", *map(str, args), "--out", str(out)])
        err = capsys.readouterr().err
        assert rc == 2 and said in err and len(err.strip().splitlines()) == 1, err
        assert not out.exists()
    with pytest.raises(Exception, match="exactly two"):
        check_comparable([read_session(two[0])])


def test_an_out_dir_holding_an_earlier_choice_is_refused(two, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "engines.json").write_text("{}")
    assert cli.main(["engines", str(two[0]), str(two[1]), "--out", str(out)]) == 2
    assert "earlier engine choice" in capsys.readouterr().err and not (out / "engines.md").exists()


def test_the_command_measures_the_final_stacks_and_names_the_faster(two, tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli.main(["engines", str(two[2]), str(two[0]), "--out", str(out), "--max-pairs", "12", "--trust-session"])
    assert rc == 0
    cap = capsys.readouterr()
    res = json.loads((out / "engines.json").read_text())
    m, d = res["measurement"], res["decision"]
    tuned, short = read_session(two[0]), read_session(two[2])
    assert tuned.final_config["fast_path"] is True and short.final_config["fast_path"] is False
    # B is the session whose own median is higher; its final stack is what runs
    assert m["candidate_session"] == str(tuned.directory) and m["candidate_config"] == tuned.final_config
    assert m["baseline_config"] == short.final_config
    # the decision re-derives from the pairs file alone
    lines = [json.loads(x) for x in (out / "engines_pairs.jsonl").read_text().splitlines()]
    assert [x["kind"] for x in lines][0] == "setup" and lines[-1]["kind"] == "result"
    pairs = [x for x in lines if x["kind"] == "pair"]
    assert len(pairs) == m["n_pairs"] >= 3
    assert all(math.isclose(p["log_ratio"], math.log(p["value_b"] / p["value_a"])) for p in pairs)
    again = decision_at([p["log_ratio"] for p in pairs], ProtocolSettings(**m["settings"]))
    assert again.verdict == m["verdict"] and math.isclose(again.ratio, m["protocol"]["decision"]["ratio"])
    # the tuned stack (fast_path's true x1.15 over the other's) is measured faster, and named
    assert d["outcome"] == "b_faster" and d["faster"] == tuned.name and 1.0 < d["ci_low"] < 1.15 < d["ci_high"]
    assert res["recommendation"]["deploy"] == tuned.name
    q = m["quality"]
    assert q["evaluated"] and {s["set_name"] for s in q["sets"]} == {"eval", "heldout"}
    md = (out / "engines.md").read_text()
    assert f"Deploy {tuned.name}" in md and "engines_pairs.jsonl" in md and tuned.name in cap.out
    assert "pair 1/12" in cap.err  # progress lines while measuring


def _m(verdict, ratio, lo, hi, **dec):
    return {"baseline": "A", "candidate": "B", "verdict": verdict, "n_pairs": 8,
            "protocol": {"decision": {"ratio": ratio, "ci_low": lo, "ci_high": hi, "n_pairs": 8, "min_gain": 0.01,
                                      "floor": 0.0, **dec}}}


def test_the_decision_reads_the_keep_rule_in_both_directions():
    assert engine_decision(_m("keep", 1.3, 1.2, 1.4))["outcome"] == "b_faster"
    d = engine_decision(_m("revert", 0.8, 0.75, 0.85))
    assert d["outcome"] == "a_faster" and d["faster"] == "A" and math.isclose(d["ratio"], 1 / 0.8)
    assert math.isclose(d["ci_low"], 1 / 0.85) and math.isclose(d["ci_high"], 1 / 0.75)
    assert engine_decision(_m("inconclusive", 1.0, 0.97, 1.03))["outcome"] == "no_difference"
    # the upper end must clear 1/(1 + min_gain), not just 1
    assert engine_decision(_m("revert", 0.99, 0.985, 0.995))["outcome"] == "no_difference"
    # with an A/A floor the threshold widens both ways
    assert engine_decision(_m("revert", 0.95, 0.93, 0.97, floor=0.05))["outcome"] == "no_difference"
    assert engine_decision({"baseline": "A", "candidate": "B", "verdict": "failed", "error": "boom"})["outcome"] == "failed"


def test_the_same_final_stack_on_both_sides_is_no_measured_difference(two, tmp_path):
    out = tmp_path / "out"
    assert read_session(two[0]).final_config == read_session(two[1]).final_config
    assert cli.main(["engines", str(two[0]), str(two[1]), "--out", str(out), "--max-pairs", "6", "--quiet", "--trust-session"]) == 0
    res = json.loads((out / "engines.json").read_text())
    assert res["decision"]["outcome"] == "no_difference" and res["recommendation"]["deploy"] is None
    assert "No measured difference" in (out / "engines.md").read_text()


class _DiesAfter(SyntheticAdapter):
    """A synthetic engine whose runs fail from its ``n``-th on (a server that died mid-measurement)."""

    def __init__(self, n, **kw):
        super().__init__(**kw)
        self.n, self.k = n, 0

    def run(self, handle, seed):
        self.k += 1
        rec = super().run(handle, seed)
        if self.k >= self.n:
            rec.success, rec.error = False, "crash: server is not running"
        return rec


def test_an_engine_that_dies_mid_measurement_is_exit_1_with_why(two, tmp_path, monkeypatch):
    import inferloom.engine_choice.choose as C

    real = C.make_adapter
    made = []

    def make(spec):  # the second engine built dies on its 3rd run (warm-up, pair 1, then pair 2)
        made.append(_DiesAfter(3, seed=spec.seed) if made else real(spec))
        return made[-1]

    monkeypatch.setattr(C, "make_adapter", make)
    out = tmp_path / "out"
    assert cli.main(["engines", str(two[2]), str(two[0]), "--out", str(out), "--quiet", "--trust-session"]) == 1
    res = json.loads((out / "engines.json").read_text())
    assert res["decision"]["outcome"] == "failed" and "server is not running" in res["decision"]["why"]
    assert res["measurement"]["n_pairs"] == 1 and res["recommendation"]["deploy"] is None
    md = (out / "engines.md").read_text()
    assert "No choice: the measurement failed" in md and "1 pair(s) completed before the measurement failed" in md
    assert len([x for x in (out / "engines_pairs.jsonl").read_text().splitlines() if '"kind": "pair"' in x]) == 1


def test_without_trust_session_it_says_what_it_would_run_and_measures_nothing(two, tmp_path, capsys):
    """Measuring runs what the sessions' files name (as verify --remeasure): said first, run only when asked."""
    out = tmp_path / "out"
    assert cli.main(["engines", str(two[2]), str(two[0]), "--out", str(out), "--quiet"]) == 1
    said = capsys.readouterr().out
    assert said.count("was written by someone else's inferloom run") == 2
    assert str(two[0]) in said and str(two[2]) in said and "add --trust-session" in said
    assert not out.exists()


class _Shared(SyntheticAdapter):
    """A synthetic engine that logs when its memory share is read and when it starts a server (``prepare``)."""

    def __init__(self, log, name, **kw):
        super().__init__(**kw)
        self.log, self.tag = log, name

    def memory_share(self):
        self.log.append(("share", self.tag))

    def prepare(self, config):
        self.log.append(("prepare", self.tag))
        return super().prepare(config)


def test_both_engines_read_their_memory_share_before_either_server_starts(two, tmp_path, monkeypatch):
    """Two servers on one GPU: each share comes from the memory free before the first server starts, so the
    second engine's share is not halved by the first one's (SGLang sizes its pool from the memory free at its
    own start; vLLM from its fraction of the total)."""
    import inferloom.engine_choice.choose as C

    log: list = []
    made = []

    def make(spec):
        made.append(_Shared(log, "AB"[len(made)], seed=spec.seed))
        return made[-1]

    monkeypatch.setattr(C, "make_adapter", make)
    assert cli.main(["engines", str(two[2]), str(two[0]), "--out", str(tmp_path / "o"), "--quiet",
                     "--trust-session", "--max-pairs", "3"]) == 0
    assert log[:4] == [("share", "A"), ("share", "B"), ("prepare", "A"), ("prepare", "B")]


def test_pairs_on_another_kind_of_device_are_refused_and_another_day_is_said(two, tmp_path, monkeypatch, capsys):
    """The sessions carried to a later machine (the device is lent per session): the pairs may run there when it
    is the same kind of device, and engines.md says they ran apart; another kind of device is refused, nothing
    written."""
    from inferloom.engine_choice import choose_engine
    from inferloom.engine_choice.sessions import EngineChoiceError, here_identity, machine_identity

    a, b = read_session(two[2]), read_session(two[0])
    assert here_identity() == machine_identity(a) | {"day (manifest created_at, UTC)": here_identity()[
        "day (manifest created_at, UTC)"]}  # this machine is the sessions' (their manifests were written here)
    other_kind = {**machine_identity(a), "device (manifest device.name)": "NVIDIA B200"}
    with pytest.raises(EngineChoiceError, match="NVIDIA B200") as e:
        choose_engine([a, b], tmp_path / "refused", max_pairs=3, here=other_kind)
    assert "nothing was written" in str(e.value) and not (tmp_path / "refused").exists()
    later = {**machine_identity(a), "host (manifest device.hostname)": "gpu-7", "day (manifest created_at, UTC)": "2099-01-02"}
    res = choose_engine([a, b], tmp_path / "later", max_pairs=3, here=later)
    m = res["measurement"]
    assert m["measured_at"] == later and len(m["measured_apart"]) == 2
    assert m["measured_apart"][0].startswith("host gpu-7 (the sessions': ")
    md = (tmp_path / "later" / "engines.md").read_text()
    assert "ran apart from the sessions: host gpu-7" in md and "day 2099-01-02" in md
    assert json.loads((tmp_path / "later" / "engines.json").read_text())["measurement"]["measured_apart"] == m["measured_apart"]
    same = choose_engine([a, b], tmp_path / "same", max_pairs=3)  # this machine, today: nothing said
    assert same["measurement"]["measured_apart"] == [] and "ran apart" not in (tmp_path / "same" / "engines.md").read_text()


def test_stock_final_stacks_are_an_engine_choice_and_say_what_they_would_run(capsys):
    """The published H200 pair (docs/results/sglang-h200-2026-12-05/run2): both final stacks are stock, which
    `verify --remeasure` has no ratio to re-measure but an engine choice pairs; without --trust-session the
    command says what each would start, and on this machine (no H200) --trust-session is refused in one line."""
    from pathlib import Path

    from inferloom.evidence.remeasure import RemeasureError
    from inferloom.evidence.trust import plan_lines

    root = Path(__file__).resolve().parents[1] / "docs" / "results" / "sglang-h200-2026-12-05" / "run2"
    with pytest.raises(RemeasureError, match="nothing was kept"):
        plan_lines(root / "sg")
    assert "framework sglang, model llama-3.1-8b; the final stack is stock" in "\n".join(plan_lines(root / "sg", stock_ok=True))
    assert cli.main(["engines", str(root / "sg"), str(root / "vs"), "--out", "/nonexistent-never/x"]) == 1
    out = capsys.readouterr().out
    assert "the server: /tmp/sglang-py -m sglang.launch_server" in out and "/tmp/vllm-py -m vllm" in out
    assert cli.main(["engines", str(root / "sg"), str(root / "vs"), "--out", "/nonexistent-never/x",
                     "--trust-session"]) == 2
    err = capsys.readouterr().err
    assert "the sessions ran on 'NVIDIA H200'" in err and "nothing was written" in err


def test_an_engine_variable_set_otherwise_than_in_the_sessions_is_said(two, tmp_path, monkeypatch):
    """The servers inherit the environment: an engine's own variable (VLLM_*, SGLANG_*, FLASHINFER_*) set here
    and not in the sessions (or otherwise) is said beside the machine's differences, per session."""
    from inferloom.engine_choice import choose_engine
    from inferloom.engine_choice.sessions import env_apart

    a, b = read_session(two[2]), read_session(two[0])
    assert env_apart(a, {}) == [] and env_apart(a, {"INFERLOOM_KB": "/elsewhere"}) == []  # not an engine's
    monkeypatch.setenv("VLLM_USE_FLASHINFER_SAMPLER", "0")
    res = choose_engine([a, b], tmp_path / "env", max_pairs=3)
    apart = res["measurement"]["measured_apart"]
    assert apart == [f"VLLM_USE_FLASHINFER_SAMPLER=0 ({s.name}'s session: (unset))" for s in (a, b)]
    assert "ran apart from the sessions: VLLM_USE_FLASHINFER_SAMPLER=0" in (tmp_path / "env" / "engines.md").read_text()


def test_a_manifest_whose_env_is_not_a_mapping_compares_as_none_set():
    from inferloom.session.apart import env_apart

    assert env_apart({"env": ["VLLM_X=1"]}, "s", {}) == [] and env_apart({}, "s", {"VLLM_X": "1"}) == [
        "VLLM_X=1 (s's session: (unset))"]
