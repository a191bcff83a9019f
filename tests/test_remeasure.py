"""``inferloom verify --remeasure``: the final stack rebuilt in a fresh process from the session's files alone
and measured paired against stock again; passes when the new interval overlaps the session's."""

import json
import os
import shutil
import sys

import pytest

from inferloom.cli import main
from inferloom.evidence.remeasure import remeasure
from inferloom.phases.runner import start
from inferloom.session.state import load_state
from test_session import SPEC, agents


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """A session on the stock synthetic adapter (built from the spec: a fresh process can rebuild it)."""
    d = tmp_path_factory.mktemp("remeasure") / "s"
    st = start(d, SPEC, budget_minutes=10, max_trials=4, agents=agents(), sweep=False, kb_url=None)
    assert st.stack != st.stock_config
    return d


def test_remeasure_rebuilds_the_final_stack_in_a_fresh_process_and_overlaps(capsys, synthetic):
    rc = main(["verify", str(synthetic), "--remeasure", "--trust-session", "--max-pairs", "6", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "all consistent" in out and "remeasure (fresh process" in out and "overlaps" in out and "PASS" in out
    pid = int(out.split("remeasure (fresh process ", 1)[1].split(",", 1)[0])
    assert pid != os.getpid()
    assert "ran apart from the session" not in out  # this machine, today, the same engine variables


def test_a_remeasure_on_another_host_day_or_engine_variable_says_so(capsys, synthetic, tmp_path, monkeypatch):
    """The session carried to another machine (a lent GPU is another host every time): the re-measurement runs
    and says where it differs from the session's manifest, beside its verdict."""
    d = tmp_path / "s"
    shutil.copytree(synthetic, d)
    m = json.loads((d / "manifest.json").read_text())
    m["device"]["hostname"], m["created_at"] = "gpu-7", 4_102_444_800  # 2100-01-01
    (d / "manifest.json").write_text(json.dumps(m))
    monkeypatch.setenv("VLLM_USE_FLASHINFER_SAMPLER", "0")
    r = remeasure(d, max_pairs=3)
    assert r["apart"][0].startswith("host ") and r["apart"][0].endswith("(the session's: gpu-7)")
    assert r["apart"][1].endswith("(the session's: 2100-01-01)") and r["apart"][1].startswith("day ")
    assert r["apart"][2] == "VLLM_USE_FLASHINFER_SAMPLER=0 (s's session: (unset))"
    rc = main(["verify", str(d), "--remeasure", "--trust-session", "--max-pairs", "3", "--quiet"])
    assert "remeasure ran apart from the session: host " in capsys.readouterr().out and rc in (0, 1)


def test_a_gain_that_does_not_reproduce_fails(capsys, synthetic, tmp_path):
    d = tmp_path / "s"
    shutil.copytree(synthetic, d)
    # the session claims a far larger gain than the stack gives: its CLOSE interval is moved up by x3
    lines = (d / "ledger.jsonl").read_text().splitlines()
    for i, line in enumerate(lines):
        e = json.loads(line)
        if e.get("action") == "final_compare":
            dec = e["protocol"]["decision"]
            for k in ("ratio", "ci_low", "ci_high"):
                dec[k] *= 3
            lines[i] = json.dumps(e)
    (d / "ledger.jsonl").write_text("\n".join(lines) + "\n")
    (d / "session_breakdown.json").unlink()
    r = remeasure(d, max_pairs=6)
    assert not r["passed"] and "does NOT overlap" in r["why"]


def test_nothing_kept_is_refused_clearly_by_remeasure_and_rebuild(capsys, tmp_path):
    from inferloom.workloads.synthetic import SyntheticAdapter
    from test_session import TWO_KNOBS
    flat = SyntheticAdapter(effects={"fast_path": {True: 1.0}, "useless": {True: 1.0}}, numerics={}, knobs=TWO_KNOBS,
                            noise_sd=0.05)
    d = tmp_path / "s"
    start(d, SPEC, budget_minutes=10, max_trials=2, adapter=flat, agents=agents(), sweep=False, kb_url=None)
    rc = main(["verify", str(d), "--remeasure", "--trust-session"])
    err = capsys.readouterr().err
    assert rc == 2 and "nothing was kept" in err and err.count("\n") == 1
    rc = main(["verify", str(d), "--rebuild", "--trust-session"])  # refused before any virtualenv is built
    err = capsys.readouterr().err
    assert rc == 2 and "nothing was kept" in err and err.count("\n") == 1


# The real llama-tiny `verify --remeasure` runs on test_session_real's session (one session for both: CI time).
