"""The typed parts of state.json (SessionExtra, Trial): sessions written before
them load, report and resume; the JSON written now has the same keys and
shapes; an unknown or mistyped key is a one-line StateError."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from inferloom.phases.common import agent_view
from inferloom.session.state import Budget, SessionState, StateError, load_state, save_state
from inferloom.session.state_models import SessionExtra, StockObjective, Trial, WarmReplay

ROOT = Path(__file__).resolve().parents[1]
RESULTS = sorted((ROOT / "docs" / "results").glob("**/state.json"))

# What the writers of today's main put under "extra" and in a trial, for the
# parts the sessions under docs/results do not have (a custom workload, a
# failed stock, a server that rejected a flag, a skipped replay and profile, a
# sweep point that does not apply, a kept patch's commit).
TRIAL = {"trial": 1, "cycle": 1, "changes": {"patch": "01-fast"}, "config": {"workers": 1}, "verdict": "keep",
         "kept": True, "ratio": 1.4, "ci_low": 1.3, "ci_high": 1.5, "n_pairs": 4, "quality_passed": True,
         "predicted_gain": 2, "source": "patch", "agent": "patch-dir", "lesson": "faster",
         "measurement_seq": 7, "verdict_seq": 9, "finished_at": 1796000000.5, "commit": "ab" * 20}
EXTRA = {
    "run_options": {"cycle_ceiling": 1, "sweep": False, "kb_url": None},
    "stock_failure": {"error": "CUDA out of memory", "kind": "oom", "seq": 3},
    "enablement_round": 1,
    "stock_objective": {"median": 101.5, "n_runs": 6, "ledger_seq": 4},
    "warm_replay": {"skipped": "no knowledge base (--no-kb)"},
    "profile": {"skipped": "a custom workload is the user's own process: no operator profile"},
    "ceilings": {"memory_bandwidth_bytes_per_s": 1e10, "matmul_flops_per_s": 1e11, "device_name": "cpu",
                 "matmul_dtype": "float32", "cached": True, "measured_at": 1796000000.25},
    "source": {"stock": "11" * 20, "branch": "inferloom/s1", "date": 1796000000,
               "kept": [{"id": "01-fast", "sha": "ab" * 20, "title": "fast", "message": "inferloom KEEP 01-fast",
                         "verdict_seq": 9, "proposal_key": "k:proposal", "parent": "11" * 20}],
               "seen": ["01-fast", "02-slow"], "stack": "ab" * 20, "failed_sources": [],
               "exhausted_sources": ["patch-dir"]},
    "refusals_in_a_row": 0,
    "refusals_total": 2,
    "proposals": [{"patch": "01-fast"}, "<malformed output>", {"workers": 2}],
    "stack_ratio": 1.4,
    "rejected_flags": {"--newflag": {"knob": "newflag", "value": True, "kind": "unsupported_flag",
                                     "whole_flag": True}},
    "kernel_had_turn": 1,
    "kernel_decided": {},
    "sweep": {"1": [{"point": [2, 64], "verdict": "not-applicable", "error": "micro_batch > concurrency"},
                    {"point": [4, 64], "ratio": 1.2, "ci_low": 1.1, "ci_high": 1.3, "verdict": "keep",
                     "ledger_seq": 12}],
              "2": []},
    "rollback_drill": {"passed": True, "ledger_seq": 20},
}


def _state(**over) -> dict:
    d = SessionState(session_id="s1", budget=Budget(minutes=10, trials=5)).to_dict()
    d.update(over)
    return d


@pytest.mark.parametrize("path", RESULTS, ids=[str(p.parent.relative_to(ROOT / "docs" / "results")) for p in RESULTS])
def test_the_published_sessions_load_and_write_back_the_same_json(path, tmp_path):
    old = json.loads(path.read_text())
    st = load_state(path.parent)
    assert st.to_dict() == old
    assert sorted(st.to_dict()["extra"]) == sorted(old["extra"])
    assert [list(t) for t in st.to_dict()["trials"]] == [list(t) for t in old["trials"]]  # same keys, same order
    shutil.copy(path, tmp_path / "state.json")
    save_state(tmp_path, load_state(tmp_path))
    again = json.loads((tmp_path / "state.json").read_text())
    assert {k: v for k, v in again.items() if k != "updated_at"} == {k: v for k, v in old.items() if k != "updated_at"}


def test_every_part_the_writers_use_round_trips_with_its_keys():
    d = _state(extra=EXTRA, trials=[TRIAL])
    out = SessionState.model_validate(d).to_dict()
    assert out == d
    assert list(out["trials"][0]) == list(TRIAL)
    for k, v in EXTRA.items():  # each part writes the keys it was given, in the writers' order
        if isinstance(v, dict) and k not in ("sweep", "rejected_flags", "kernel_decided"):
            assert list(out["extra"][k]) == list(v), k
    assert isinstance(out["trials"][0]["predicted_gain"], int)  # as the agent gave it


def test_extra_writes_a_key_once_set_and_none_means_absent():
    x = SessionExtra()
    assert x.model_dump() == {}
    x.stock_objective = StockObjective(median=1.0, n_runs=2, ledger_seq=1)
    x.refusals_in_a_row = 0
    x.add_proposal({"a": True})
    assert x.model_dump() == {"stock_objective": {"median": 1.0, "n_runs": 2, "ledger_seq": 1},
                              "refusals_in_a_row": 0, "proposals": [{"a": True}]}
    x.stock_objective = None  # ENABLEMENT starts the baseline over
    assert "stock_objective" not in x.model_dump()
    # a part writes its explicit nulls, and nothing it was not given
    assert WarmReplay(skipped="no recipe").model_dump() == {"skipped": "no recipe"}
    assert WarmReplay(recipe_id=3, adopted=False, ratio=None, recorded_gain=0.5, verdict_seq=None).model_dump() == {
        "recipe_id": 3, "adopted": False, "ratio": None, "recorded_gain": 0.5, "verdict_seq": None}


def test_trial_record_builds_the_trial_with_every_key():
    from inferloom.phases.trial import trial_record, verdict_entry

    t = trial_record(n=2, cycle=1, changes={"a": True}, config={"a": True, "b": 1}, outcome="keep", kept=True,
                     decision={"ratio": 1.2, "ci_low": 1.1, "ci_high": 1.3, "n_pairs": 5}, quality_passed=True,
                     proposal={"predicted_gain": 0.1, "source": "search"}, agent="rule", lesson="l", measurement_seq=4)
    assert isinstance(t, Trial)
    assert list(t.model_dump()) == [k for k in TRIAL if k != "commit"]
    assert t.model_dump()["verdict_seq"] is None and t.model_dump()["finished_at"] is None
    e = verdict_entry(t, "keep")
    assert e["outcome"] == "keep" and e["ratio"] == 1.2 and e["measurement_seq"] == 4


@pytest.mark.parametrize("over, where", [
    ({"extra": {"bogus": 1}}, "extra.bogus"),
    ({"extra": {"stack_ratio": "fast"}}, "extra.stack_ratio"),
    ({"extra": {"warm_replay": {"skipped": "x", "bogus": 1}}}, "extra.warm_replay.bogus"),
    ({"extra": {"sweep": {"1": [{"point": [1, 2], "ratio": "high"}]}}}, "extra.sweep.1.0.ratio"),
    ({"trials": [{**TRIAL, "bogus": 1}]}, "trials.0.bogus"),
    ({"trials": [{k: v for k, v in TRIAL.items() if k != "kept"}]}, "trials.0.kept"),
])
def test_an_unknown_or_mistyped_key_is_a_one_line_state_error(tmp_path, over, where):
    (tmp_path / "state.json").write_text(json.dumps(_state(**over)))
    with pytest.raises(StateError) as e:
        load_state(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and f"field '{where}'" in msg and "restore it or start a new session" in msg


@pytest.mark.parametrize("path", RESULTS[:1])
def test_agents_see_the_state_as_on_disk_plus_derived_keys(path):
    old = json.loads(path.read_text())
    view = agent_view(load_state(path.parent))
    ex = old["extra"]
    assert view == {**old, "started_at": old["created_at"], "proposals": list(ex.get("proposals", [])),
                    "kb_failures": list(ex.get("kb_failures", [])),
                    "cycle_started_at": ex.get("cycle_started_at", old["created_at"])}
    fresh = agent_view(SessionState.model_validate(_state()))
    assert fresh["proposals"] == [] and fresh["kb_failures"] == [] and fresh["cycle_started_at"] == fresh["created_at"]
