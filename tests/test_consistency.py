"""`resume` never finishes a session from a partial history: state.json and
ledger.jsonl must agree (inferloom.session.consistency), on real sessions of
the synthetic adapter, interrupted the way a kill interrupts them."""

import json
import shutil
from pathlib import Path

import pytest

from inferloom.agents.rules import RuleCritic, RuleOrchestrator, RuleRobustness
from inferloom.cli import main
from inferloom.phases.runner import resume, start
from inferloom.session import ledger as L
from inferloom.session.consistency import InconsistentSession, check_consistency, consistency_problems
from inferloom.session.state import Phase, load_state
from inferloom.spec import load_spec
from inferloom.workloads.base import Knob
from inferloom.workloads.synthetic import SyntheticAdapter

SPEC = load_spec(None, {"model": "llama-tiny", "framework": "synthetic", "device": "cpu",
                        "protocol.bootstrap_resamples": 999, "protocol.min_pairs": 4, "protocol.max_pairs": 10,
                        "protocol.pair_step": 2, "quality.eval_prompts": 4, "quality.heldout_prompts": 4,
                        "quality.prompt_len": 8, "quality.continuation_len": 8})
KNOBS = [Knob("fast_path", "bool", False, "synthetic +20%"), Knob("useless", "bool", False, "synthetic 0%")]
RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
PUBLISHED = sorted(p.parent for p in RESULTS.rglob("state.json"))


class _Killed(BaseException):
    """Stands in for a kill: nothing in the session catches it."""


def _agents():
    return {"orchestrator": RuleOrchestrator(seed=0), "critic_factory": RuleCritic, "robustness": RuleRobustness()}


def _adapter(die_at=None):
    class Dies(SyntheticAdapter):
        runs = 0

        def run(self, handle, seed):
            Dies.runs += 1
            if die_at is not None and Dies.runs == die_at:
                raise _Killed()
            return super().run(handle, seed)

    return Dies(effects={"fast_path": {True: 1.20}, "useless": {True: 1.0}}, numerics={}, knobs=KNOBS, noise_sd=0.05)


@pytest.fixture
def interrupted(tmp_path):
    """A session killed in FRAMEWORK after trials were measured (state not DONE)."""
    d = tmp_path / "s"
    with pytest.raises(_Killed):
        start(d, SPEC, budget_minutes=10, max_trials=6, adapter=_adapter(die_at=60), agents=_agents(), kb_url=None,
              sweep=False)
    st = load_state(d)
    assert st.phase != Phase.DONE and st.trials and st.last_ledger_seq > 5
    return d


def _files(d):
    return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}


def _refused(d, capsys, match):
    before = _files(d)
    assert main(["resume", str(d), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "disagree" in err and match in err and "Traceback" not in err
    assert _files(d) == before  # nothing was run, nothing written
    with pytest.raises(InconsistentSession):
        resume(d, adapter=_adapter(), agents=_agents())


def test_the_interrupted_session_resumes_when_nothing_was_touched(interrupted):
    assert consistency_problems(load_state(interrupted), L.read_entries(interrupted)) == []
    st = resume(interrupted, adapter=_adapter(), agents=_agents())
    assert st.phase == Phase.DONE


def test_resume_refuses_an_emptied_ledger(interrupted, capsys):
    (interrupted / "ledger.jsonl").write_bytes(b"")
    _refused(interrupted, capsys, "the ledger holds 0")


def test_resume_refuses_a_state_pointing_past_the_ledger(interrupted, capsys):
    raw = json.loads((interrupted / "state.json").read_text())
    raw["last_ledger_seq"] = 9999
    (interrupted / "state.json").write_text(json.dumps(raw))
    _refused(interrupted, capsys, "up to #9999")


def test_resume_refuses_a_truncated_ledger(interrupted, capsys):
    st = load_state(interrupted)
    lines = (interrupted / "ledger.jsonl").read_bytes().splitlines(keepends=True)
    cut = st.trials[0].measurement_seq - 1  # the trials' measurements and verdicts are gone
    (interrupted / "ledger.jsonl").write_bytes(b"".join(lines[:cut]))
    _refused(interrupted, capsys, f"holds {cut}")


def test_resume_refuses_when_a_cited_measurement_is_not_one(interrupted, capsys):
    """Same length, but the entry the stock baseline cites is not a measurement any more."""
    st = load_state(interrupted)
    seq = st.extra.stock_objective.ledger_seq
    lines = (interrupted / "ledger.jsonl").read_bytes().splitlines(keepends=True)
    lines[seq - 1] = (json.dumps({"seq": seq, "ts": 0.0, "kind": "phase", "from": "PRELUDE", "to": "PRELUDE"})
                      + "\n").encode()
    (interrupted / "ledger.jsonl").write_bytes(b"".join(lines))
    _refused(interrupted, capsys, f"stock baseline (extra.stock_objective) cites ledger #{seq}")


def test_consistency_problems_is_a_pure_check_of_each_citation(interrupted):
    st = load_state(interrupted)
    entries = L.read_entries(interrupted)
    assert consistency_problems(st, entries) == []
    t = st.trials[0]
    # each citation the state makes, removed in turn, is named
    for seq, what in [(st.extra.stock_objective.ledger_seq, "stock baseline"),
                      (st.noise_floor["ledger_seq"], "A/A noise floor"),
                      (t.measurement_seq, f"trial {t.trial}'s measurement"),
                      (t.verdict_seq, f"trial {t.trial}'s verdict")]:
        changed = [dict(e, kind="note") if e["seq"] == seq else e for e in entries]
        problems = consistency_problems(st, changed)
        assert any(what in p and f"#{seq}" in p for p in problems), (what, problems)
    # seqs must be 1..n
    swapped = [dict(e) for e in entries]
    swapped[1]["seq"], swapped[2]["seq"] = 3, 2
    assert any("not 1.." in p for p in consistency_problems(st, swapped))
    # the ledger may run past the state (a crash after the ledger write), never stop short of it
    longer = entries + [{"seq": len(entries) + 1, "ts": 0.0, "kind": "error"}]
    assert consistency_problems(st, longer) == []
    with pytest.raises(InconsistentSession, match="and [0-9]+ more"):
        check_consistency(interrupted, st, [])


@pytest.mark.parametrize("src", PUBLISHED, ids=[str(p.relative_to(RESULTS)) for p in PUBLISHED])
def test_published_sessions_are_consistent(src, tmp_path):
    d = tmp_path / "s"
    shutil.copytree(src, d)
    assert consistency_problems(load_state(d), L.read_entries(d)) == []
