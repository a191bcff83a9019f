"""`inferloom optimize`: coordinator, agents, state, resume, close."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from inferloom.agents.rules import RuleCritic, RuleOrchestrator, RuleRobustness
from inferloom.session import ledger as L
from inferloom.phases.allowlist import PHASE_ALLOWLIST, validate_proposal
from inferloom.phases.runner import SessionExists, resume, start
from inferloom.session.state import Phase, load_state
from inferloom.spec import load_spec
from inferloom.workloads.base import Knob
from inferloom.workloads.synthetic import SyntheticAdapter

SPEC = load_spec(None, {"model": "llama-tiny", "framework": "synthetic", "device": "cpu",
                        "protocol.bootstrap_resamples": 999, "quality.eval_prompts": 4, "quality.heldout_prompts": 4,
                        "quality.prompt_len": 8, "quality.continuation_len": 8})
TWO_KNOBS = [Knob("fast_path", "bool", False, "synthetic +20%"), Knob("useless", "bool", False, "synthetic 0%")]


def two_knob_adapter(**kw):
    return SyntheticAdapter(effects={"fast_path": {True: 1.20}, "useless": {True: 1.0}}, numerics={},
                            knobs=TWO_KNOBS, noise_sd=0.05, **kw)


def agents():
    return {"orchestrator": RuleOrchestrator(seed=0), "critic_factory": RuleCritic, "robustness": RuleRobustness()}


def test_true_gain_kept_and_no_gain_not(tmp_path):
    st = start(tmp_path / "s", SPEC, budget_minutes=10, max_trials=10, adapter=two_knob_adapter(), agents=agents())
    assert st.phase == Phase.DONE
    kept = [t for t in st.trials if t.kept]
    assert any(t.changes.get("fast_path") is True for t in kept)
    assert not any(t.changes.get("useless") is True and "fast_path" not in t.changes for t in kept)
    assert st.stack["fast_path"] is True and st.stack["useless"] is False
    b = json.loads((tmp_path / "s" / "session_breakdown.json").read_text())
    assert b["schema_version"] == 1 and 1.1 < b["final"]["ratio"] < 1.35
    assert b["final"]["quality_passed"] is True and b["unscored_keep_count"] == 0


def test_artifacts_and_schemas(tmp_path):
    d = tmp_path / "s"
    start(d, SPEC, budget_minutes=10, max_trials=4, adapter=SyntheticAdapter(), agents=agents())
    st = load_state(d)  # validates the schema
    assert st.phase == Phase.DONE and st.stop_reason and st.pending_action is None
    manifest = json.loads((d / "manifest.json").read_text())
    for key in ("schema_version", "inferloom", "versions", "device", "spec", "spec_hash", "seeds", "env"):
        assert key in manifest
    entries = L.read_entries(d)
    assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1))
    kinds = {e["kind"] for e in entries}
    assert {L.MEASUREMENT, L.PROPOSAL, L.VERDICT, L.PHASE, L.AGENT_IO, L.CLOSE} <= kinds
    # every proposal names its agent and predicted gain; every verdict cites its measurement
    for p in (e for e in entries if e["kind"] == L.PROPOSAL):
        assert p["agent"] and "predicted_gain" in p
    seqs = {e["seq"]: e for e in entries}
    for v in (e for e in entries if e["kind"] == L.VERDICT):
        assert seqs[v["measurement_seq"]]["kind"] == L.MEASUREMENT
    assert st.used.trials == len([e for e in entries if e["kind"] == L.VERDICT]) == len(st.trials)
    b = json.loads((d / "session_breakdown.json").read_text())
    for key in ("schema_version", "stock", "final", "action_path", "rejected", "stop_reason",
                "unscored_keep_count", "predicted_vs_measured", "time_s"):
        assert key in b
    report = (d / "report.md").read_text()
    assert "ledger #" in report and "Stop reason" in report
    # report re-renders from the ledger alone
    (d / "report.md").unlink()
    (d / "state.json").rename(d / "state.moved")
    from inferloom.report.artifacts import write_artifacts

    assert write_artifacts(d) == b
    assert (d / "report.md").read_text() == report


def test_existing_session_is_not_overwritten(tmp_path):
    start(tmp_path / "s", SPEC, budget_minutes=10, max_trials=1, adapter=SyntheticAdapter(), agents=agents())
    with pytest.raises(SessionExists, match="resume"):
        start(tmp_path / "s", SPEC, budget_minutes=10, max_trials=1, adapter=SyntheticAdapter(), agents=agents())


def test_allowlist_refuses_actions_outside_the_phase():
    state = {"stack": {"fast_path": False, "useless": False}, "device": "cpu", "pinned": {}, "measured_config_keys": []}
    ok, rule, _ = validate_proposal({"action": "try_config", "changes": {"fast_path": True}}, "FRAMEWORK", state, TWO_KNOBS)
    assert ok and rule is None
    for phase in ("PRELUDE", "KERNEL", "SWEEP", "CLOSE"):
        assert "try_config" not in PHASE_ALLOWLIST[phase]
        _, rule, why = validate_proposal({"action": "try_config", "changes": {"fast_path": True}}, phase, state, TWO_KNOBS)
        assert rule == "action_not_allowed_in_phase" and phase in why
    cases = [
        ("garbage", "malformed_output"),
        ({"action": "launch_missiles"}, "unknown_action"),
        ({"action": "try_config"}, "malformed_output"),
        ({"action": "try_config", "changes": {"warp": 1}}, "unknown_knob"),
        ({"action": "try_config", "changes": {"fast_path": "maybe"}}, "bad_value"),
        ({"action": "try_config", "changes": {"fast_path": False}}, "no_change"),
    ]
    for raw, expected in cases:
        assert validate_proposal(raw, "FRAMEWORK", state, TWO_KNOBS)[1] == expected
    measured = {**state, "measured_config_keys": ["fast_path=True,useless=False"]}
    assert validate_proposal({"action": "try_config", "changes": {"fast_path": True}}, "FRAMEWORK", measured, TWO_KNOBS)[1] == "already_measured"
    pinned = {**state, "pinned": {"fast_path": False}}
    assert validate_proposal({"action": "try_config", "changes": {"fast_path": True}}, "FRAMEWORK", pinned, TWO_KNOBS)[1] == "pinned_knob"


class ScriptedOrchestrator:
    """Emits malformed output first, then defers to the real one."""

    name = "scripted"

    def __init__(self):
        self.real = RuleOrchestrator(seed=0)
        self.script = ["not a dict", {"action": "try_config", "changes": {"warp_drive": True}}, {"action": "sweep"}]

    def propose(self, state):
        return self.script.pop(0) if self.script else self.real.propose(state)


def test_malformed_agent_output_is_refused_and_the_session_completes(tmp_path):
    ag = {**agents(), "orchestrator": ScriptedOrchestrator()}
    st = start(tmp_path / "s", SPEC, budget_minutes=10, max_trials=3, adapter=two_knob_adapter(), agents=ag)
    assert st.phase == Phase.DONE
    refusals = [e for e in L.read_entries(tmp_path / "s") if e["kind"] == L.REFUSAL]
    assert [r["rule"] for r in refusals[:3]] == ["malformed_output", "unknown_knob", "unknown_action"]
    assert all(r["agent"] == "scripted" for r in refusals[:3])
    assert st.used.trials >= 1 and st.stop_reason


def _cli(args, env=None):
    return subprocess.Popen([sys.executable, "-m", "inferloom.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
                            start_new_session=True)


def _children_of(pid):
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(p))
            except (OSError, ValueError, IndexError):
                pass
    return out


@pytest.mark.slow
def test_kill_9_then_resume_keeps_the_ledger_and_state_consistent(tmp_path):
    d = tmp_path / "s"
    env = {"INFERLOOM_SYNTHETIC_DELAY_S": "0.01", "PYTHONUNBUFFERED": "1"}
    args = ["optimize", "--model", "llama-tiny", "--framework", "synthetic", "--device", "cpu", "--seed", "3",
            "--budget-minutes", "10", "--max-trials", "6", "--out", str(d), "--quiet"]
    rng = random.Random(7)
    p = _cli(args, env)
    kills = 0
    for attempt in range(12):
        time.sleep(rng.uniform(0.8, 3.0) if attempt else rng.uniform(2.0, 3.0))
        if p.poll() is not None:
            break
        kids = _children_of(p.pid)
        p.send_signal(signal.SIGKILL)
        p.wait()
        kills += 1
        for k in kids:  # nothing it started outlives it
            assert not os.path.exists(f"/proc/{k}") or open(f"/proc/{k}/stat").read().split()[2] == "Z"
        if not (d / "state.json").exists():
            p = _cli(args, env)  # killed before the first state: start again
            continue
        st = load_state(d)
        entries = L.read_entries(d)
        assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1))
        assert (entries[-1]["seq"] if entries else 0) >= st.last_ledger_seq  # ledger is written before state
        p = _cli(["resume", str(d), "--quiet"], env)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert kills >= 2
    st = load_state(d)
    assert st.phase == Phase.DONE
    entries = L.read_entries(d)
    assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1))
    keys = [e["key"] for e in entries if "key" in e]
    assert len(keys) == len(set(keys))  # nothing duplicated
    verdicts = [e for e in entries if e["kind"] == L.VERDICT]
    assert len(verdicts) == st.used.trials == len(st.trials)
    assert [v["trial"] for v in verdicts] == list(range(1, len(verdicts) + 1))
    assert len([e for e in entries if e["kind"] == L.CLOSE]) == 1
    assert len([e for e in entries if e["kind"] == L.MEASUREMENT and e.get("action") == "measure_stock"]) == 1
    assert (d / "report.md").is_file()


def test_resume_of_a_finished_session_is_a_no_op(tmp_path):
    d = tmp_path / "s"
    start(d, SPEC, budget_minutes=10, max_trials=2, adapter=SyntheticAdapter(), agents=agents())
    n = len(L.read_entries(d))
    st = resume(d, adapter=SyntheticAdapter(), agents=agents())
    assert st.phase == Phase.DONE and len(L.read_entries(d)) == n


class _Killed(BaseException):
    """Stands in for a kill: nothing in the session catches it."""


def test_resume_continues_with_the_options_the_session_was_started_with(tmp_path):
    d = tmp_path / "s"

    class DiesOnce(SyntheticAdapter):
        runs = 0

        def run(self, handle, seed):
            DiesOnce.runs += 1
            if DiesOnce.runs == 30:  # in FRAMEWORK, after PRELUDE's stock and A/A runs
                raise _Killed()
            return super().run(handle, seed)

    ad = DiesOnce(effects={"fast_path": {True: 1.20}, "useless": {True: 1.0}}, numerics={}, knobs=TWO_KNOBS,
                  noise_sd=0.05)
    with pytest.raises(_Killed):
        start(d, SPEC, budget_minutes=10, max_trials=6, adapter=ad, agents=agents(), sweep=False, cycle_ceiling=1)
    assert load_state(d).to_dict()["extra"]["run_options"] == {"sweep": False, "cycle_ceiling": 1}
    st = resume(d, adapter=two_knob_adapter(), agents=agents())  # no options given again
    assert st.phase == Phase.DONE and st.cycle == 1
    skips = [e for e in L.read_entries(d) if e["kind"] == L.PHASE and e.get("phase") == "SWEEP"]
    assert skips and skips[0]["reason"] == "sweep disabled"
    assert any(t.kept for t in st.trials)  # cycle 1 kept something: only the options stopped a sweep and cycle 2


def test_stock_failure_enters_enablement_and_stops_with_the_reason(tmp_path):
    bad = SyntheticAdapter(fail_runs={"fast_path": {False: "synthetic crash"}})
    st = start(tmp_path / "s", SPEC, budget_minutes=10, max_trials=2, adapter=bad, agents=agents())
    assert st.phase == Phase.DONE
    assert "enablement" in st.stop_reason and "rung 3" in st.stop_reason
    rungs = [e for e in L.read_entries(tmp_path / "s") if e["kind"] == L.ENABLEMENT_RUNG]
    assert rungs[0]["rung"] == 1 and rungs[-1]["rung"] == 6  # the whole ladder, 3-6 declared
    # the synthetic engine has no source rungs (SourceRungs): rungs 3-5 say so, rung 6 is on paper
    assert [r["outcome"] for r in rungs if r["rung"] in (3, 4, 5)] == [
        "nothing to try: the engine has no source rungs (SourceRungs)"] * 3
    assert [r["rung"] for r in rungs if r["rung"] >= 3] == [3, 4, 5, 6]


def test_warm_replay_adopts_a_recipe_that_reproduces_and_marks_drift_otherwise(tmp_path):
    from inferloom.kb import RecipeStore

    first = start(tmp_path / "a", SPEC, budget_minutes=10, max_trials=10, adapter=two_knob_adapter(), agents=agents())
    assert first.stack["fast_path"] is True
    # same workload, same KB: PRELUDE replays the recipe and adopts it
    second = start(tmp_path / "b", SPEC, budget_minutes=10, max_trials=10, adapter=two_knob_adapter(), agents=agents())
    replay = [t for t in second.trials if t.agent == "kb-replay"]
    assert len(replay) == 1 and replay[0].kept and second.extra.warm_replay.adopted is True
    assert second.trials[0].agent == "kb-replay"  # replayed before any search
    lookups = [e for e in L.read_entries(tmp_path / "b") if e["kind"] == "kb_lookup"]
    assert len(lookups) == 1
    # a machine where the recipe no longer helps: it is not adopted and is marked drift
    flat = SyntheticAdapter(effects={"fast_path": {True: 1.0}, "useless": {True: 1.0}}, numerics={},
                            knobs=TWO_KNOBS, noise_sd=0.05)
    third = start(tmp_path / "c", SPEC, budget_minutes=10, max_trials=3, adapter=flat, agents=agents())
    replay = [t for t in third.trials if t.agent == "kb-replay"]
    assert len(replay) == 1 and not replay[0].kept and third.extra.warm_replay.adopted is False
    with RecipeStore() as store:
        assert [r.status for r in store.list_recipes()] == ["drift"]


def test_no_headroom_left_closes_instead_of_another_cycle(tmp_path):
    from types import SimpleNamespace

    from inferloom.session.state import Budget, SessionState
    from inferloom.phases.sweep import _next

    st = SessionState(session_id="x", budget=Budget(minutes=10, trials=10), phase=Phase.SWEEP, cycle=1,
                      extra={"roofline_stock": {"ledger_seq": 4, "headroom": 1.5}, "stack_ratio": 1.45})
    moves = []
    c = SimpleNamespace(options=SimpleNamespace(cycle_ceiling=3), budget_reason=lambda s: None,
                        enter_phase=lambda s, p, why: moves.append((p, why)))
    _next(c, st, kept_now=True)
    assert moves[0][0] == Phase.CLOSE and "roofline" in st.stop_reason
    st2 = SessionState(session_id="y", budget=Budget(minutes=10, trials=10), phase=Phase.SWEEP, cycle=1,
                       extra={"roofline_stock": {"ledger_seq": 4, "headroom": 3.0}, "stack_ratio": 1.45})
    moves.clear()
    c.clock = lambda: 0.0
    _next(c, st2, kept_now=True)
    assert moves[0][0] == Phase.FRAMEWORK and st2.cycle == 2


def test_a_crashing_quality_probe_rejects_the_candidate_and_the_session_goes_on(tmp_path):
    # seen on the H200: a forced SDPA kernel ran the timed (unpadded) batches but had
    # no kernel for the padded quality prompts, and the exception ended the session
    ad = two_knob_adapter(fail_quality={"fast_path": {True: "No available kernel. Aborting execution."}})
    st = start(tmp_path / "s", SPEC, budget_minutes=10, max_trials=3, adapter=ad, agents=agents())
    assert st.phase == Phase.DONE and st.stack["fast_path"] is False
    fast = [t for t in st.trials if t.changes.get("fast_path") is True]
    assert fast and not any(t.kept for t in fast)
    m = [e for e in L.read_entries(tmp_path / "s")
         if e["kind"] == L.MEASUREMENT and e.get("candidate_config", {}).get("fast_path") is True]
    q = m[0]["quality"]
    assert q["passed"] is False and q["rule"] == "quality_probe_failed" and "No available kernel" in q["error"]
    verdicts = [e for e in L.read_entries(tmp_path / "s") if e["kind"] == L.VERDICT and e["measurement_seq"] == m[0]["seq"]]
    assert "quality_probe_failed" in json.dumps(verdicts)
