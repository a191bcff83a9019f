"""The default orchestrator's adaptive proposing rules (agents/search_moves.py,
agents/search_model.py): each test fails with the rule turned off."""

from __future__ import annotations

from inferloom.agents import rules
from inferloom.agents.rules import RuleOrchestrator
from inferloom.agents.search_moves import repair
from inferloom.agents.search_view import SearchView
from inferloom.workloads.base import Knob

from test_agents import engine_knobs, feed, make_state


def feasible(cfg):  # as the engine: prompt_lookup needs micro_batch=1 and the dynamic cache
    return not (cfg["prompt_lookup"] > 0 and (cfg["micro_batch"] != 1 or cfg["cache_implementation"] != "dynamic"))


def test_repair_adds_the_fewest_changes_the_rules_need():
    state = make_state(engine_knobs())
    view = SearchView(state)
    assert repair(view, {"compile_mode": "default"}, feasible) == {"compile_mode": "default"}
    assert repair(view, {"prompt_lookup": 3}, feasible) == {"prompt_lookup": 3, "micro_batch": 1}
    state["stack"] = {**state["stack"], "cache_implementation": "static"}
    assert repair(SearchView(state), {"prompt_lookup": 3}, feasible) == {
        "prompt_lookup": 3, "cache_implementation": "dynamic", "micro_batch": 1}
    assert repair(SearchView(state), {"prompt_lookup": 3}, feasible, extra=1) is None


def test_values_the_rules_gate_are_reached(monkeypatch):
    """prompt_lookup > 0 is refused at stock's micro_batch=8: one knob at a time never
    reaches it; completed by repair, the search measures it."""
    def reached(orch):
        state = make_state(engine_knobs(), stack=None)
        state["stack"] = dict(state["stock_config"])
        for _ in range(25):
            p = orch.propose(state)
            if p["action"] != "try_config":
                break
            assert feasible({**state["stack"], **p["changes"]})
            if p["changes"].get("prompt_lookup", 0) > 0:
                return True
            feed(state, p, verdict="revert", ratio=0.97)
        return False

    assert reached(RuleOrchestrator(prior_table=[], feasible=feasible))
    # without repair (a refused change-set is skipped, not completed), one knob at a time never gets there
    monkeypatch.setattr(rules, "repair", lambda view, ch, f, extra=2: dict(ch) if f({**view.stack, **ch}) else None)
    assert not reached(RuleOrchestrator(prior_table=[], feasible=feasible, stall=None))


def test_priors_alternate_with_the_search_once_they_stop_helping():
    state = make_state(engine_knobs())
    sources = []
    for _ in range(6):
        p = RuleOrchestrator(feasible=lambda cfg: True, priors="slots").propose(state)
        sources.append(p["source"])
        feed(state, p, verdict="revert", ratio=0.97)
    assert sources == ["prior", "search", "prior", "search", "prior", "search"]
    state = make_state(engine_knobs())
    plain = []
    for _ in range(6):
        p = RuleOrchestrator(feasible=lambda cfg: True, prior_patience=None, priors="slots").propose(state)
        plain.append(p["source"])
        feed(state, p, verdict="revert", ratio=0.97)
    assert plain == ["prior"] * 6


def test_a_value_measured_good_is_carried_to_other_configurations():
    """The additive model: fast_path=True measured +20% (reverted, so the stack stays);
    once single changes run out of promise, the pairs proposed keep fast_path=True."""
    knobs = [Knob("fast_path", "bool", False, ""), Knob("junk", "int", 0, "", low=0, high=30),
             Knob("mode", "choice", "a", "", choices=tuple("abcde"))]
    state = make_state(knobs)
    orch = RuleOrchestrator(stall=3, search="ucb")
    picks = []
    for _ in range(12):
        p = orch.propose(state)
        cfg = {**state["stack"], **p["changes"]}
        picks.append(cfg["fast_path"])
        feed(state, p, verdict="revert", ratio=1.2 if cfg["fast_path"] else 0.95)
    assert picks[0] and all(picks[3:]), picks  # the first is the widest-unknown bool; then pairs with it (TPE: 6 of 9)
