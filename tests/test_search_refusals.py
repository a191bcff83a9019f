"""Refusals learned in the session (agents/search_refusals.py): without the
engine's cross-knob rules, a refused or failed trial's combination is never
proposed again, its generalisation is ranked last, and the default search is
the additive model. Each test fails with the rule turned off."""

from __future__ import annotations

from inferloom.agents.priors import Prior
from inferloom.agents.rules import RuleOrchestrator
from inferloom.agents.search_refusals import contains_refused, refused_combinations, suspect
from inferloom.agents.search_view import SearchView
from inferloom.workloads.base import Knob

from test_agents import engine_knobs, feed, make_state

BOTH = frozenset({"cpu", "cuda"})
KNOBS = [Knob("fast", "bool", False, ""), Knob("mode", "choice", "a", "", choices=("a", "b")),
         Knob("junk", "int", 0, "", low=0, high=3)]


def refuse(state, changes, message):
    """A trial the engine refused, as a session records it: the rule critic's lesson quotes the error."""
    feed(state, {"changes": changes}, verdict="failed", ratio=None)
    state["trials"][-1].update(ratio=None, lesson=f"{changes}: protocol verdict failed ({message})")


def test_a_refused_combination_is_never_proposed_again():
    """fast=True was refused with mode=a: a prior that holds the same combination (plus junk=1, so it is
    a configuration never measured) is skipped; a prior without it goes first."""
    table = [Prior("fast-and-junk", {"fast": True, "junk": 1}, 0.5, "x", BOTH, 1),
             Prior("junk-only", {"junk": 2}, 0.1, "x", BOTH, 2)]
    state = make_state(KNOBS)
    refuse(state, {"fast": True}, "knob 'fast': needs mode=b, got mode=a")
    view = SearchView(state)
    assert view.refused == [{"fast": True, "mode": "a"}]
    assert contains_refused({"fast": True, "mode": "a", "junk": 1}, view.refused)
    for _ in range(6):
        p = RuleOrchestrator(prior_table=table).propose(state)
        if p["action"] != "try_config":
            break
        cfg = {**state["stack"], **p["changes"]}
        assert not (cfg["fast"] is True and cfg["mode"] == "a"), p
        feed(state, p, verdict="revert", ratio=0.99)


def test_the_knobs_the_message_names_scope_the_refusal():
    """Once mode=b is kept, fast=True is no longer refused (the message named mode=a): it is proposed."""
    table = [Prior("fast", {"fast": True}, 0.5, "x", BOTH, 1)]
    state = make_state(KNOBS)
    refuse(state, {"fast": True}, "knob 'fast': needs mode=b, got mode=a")
    feed(state, {"changes": {"mode": "b"}}, verdict="keep", ratio=1.1)
    p = RuleOrchestrator(prior_table=table).propose(state)
    assert p["changes"] == {"fast": True} and p["source"] == "prior"
    # a message naming no other knob: the changed values alone, refused whatever the others
    state = make_state(KNOBS)
    refuse(state, {"fast": True}, "server exited with code 1")
    assert SearchView(state).refused == [{"fast": True}]
    feed(state, {"changes": {"mode": "b"}}, verdict="keep", ratio=1.1)
    assert RuleOrchestrator(prior_table=table).propose(state)["changes"] != {"fast": True}


def test_other_values_of_a_refused_knob_are_ranked_last():
    """n=1 was refused at stock: n=2..5 are suspect (same move off n's feasible value) and come after
    every other unmeasured change, although n is first in knob order (ties go to knob order)."""
    knobs = [Knob("n", "int", 0, "", low=0, high=5), Knob("fast", "bool", False, ""),
             Knob("mode", "choice", "a", "", choices=("a", "b", "c"))]
    state = make_state(knobs)
    refuse(state, {"n": 1}, "knob 'n': not supported here")
    assert suspect({"n": 3, "fast": False, "mode": "a"}, SearchView(state).suspect)
    moved = []
    for _ in range(3):
        p = RuleOrchestrator(prior_table=[]).propose(state)
        moved.append(sorted(p["changes"]))
        feed(state, p, verdict="revert", ratio=0.99)
    assert all("n" not in m for m in moved), moved


def test_refused_trials_are_not_scored_as_slow():
    """The model leaves a refused trial out of its regression (TPE's history scores it with the penalty)."""
    state = make_state(KNOBS)
    refuse(state, {"fast": True}, "knob 'fast': needs mode=b, got mode=a")
    feed(state, {"changes": {"junk": 1}}, verdict="revert", ratio=0.99)
    orch, view = RuleOrchestrator(), SearchView(state)
    assert [p["junk"] for p, _ in orch._history(view, feasible_only=True)] == [1]
    assert len(list(orch._history(view))) == 2


def test_without_the_rules_the_default_is_the_additive_model():
    """No ``feasible`` (e.g. the vLLM adapter): the same search as with the rules (measured in
    docs/benchmarks.md section 10); ``search="tpe"`` keeps the previous one."""
    blind = RuleOrchestrator()
    assert (blind.search, blind.prior_patience, blind.stall) == ("ucb", 1, 6)
    assert RuleOrchestrator(search="tpe").search == "tpe"
    state = make_state([Knob("a", "bool", False, ""), Knob("b", "int", 0, "", low=0, high=9)])
    assert "additive model" in blind.propose(state)["rationale"]


def test_refusals_are_read_from_the_stack_they_were_measured_against():
    """Replayed from stock: the changed values are relative to the stack of that trial."""
    state = make_state(engine_knobs())
    feed(state, {"changes": {"micro_batch": 2}}, verdict="keep", ratio=1.1)
    refuse(state, {"prompt_lookup": 3}, "knob 'prompt_lookup': needs micro_batch=1, got micro_batch=2")
    refused, patterns = refused_combinations(SearchView(state))
    assert refused == [{"micro_batch": 2, "prompt_lookup": 3}]
    assert patterns == [({"prompt_lookup": 0}, {"micro_batch": 2})]
