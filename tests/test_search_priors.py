"""Expert priors folded into the default orchestrator's model (agents/search_priors.py,
RuleOrchestrator(priors="model")): a prior's claim is the prior mean of its value's
coefficient; each test fails without it."""

from __future__ import annotations

import math

import pytest

from inferloom.agents.priors import Prior
from inferloom.agents.rules import RuleOrchestrator
from inferloom.agents.search_model import ucb_proposal
from inferloom.agents.search_priors import claimed_by, prior_means
from inferloom.agents.search_view import SearchView
from inferloom.workloads.base import Knob

from test_agents import engine_knobs, feed, make_state

CPU = frozenset({"cpu"})


def prior(name, changes, gain, rank):
    return Prior(name, changes, gain, f"{name} (test)", CPU, rank)


def test_a_wider_prior_claims_what_is_left_of_its_gain_over_its_unclaimed_values():
    stock = {"a": 0, "b": 0, "c": 0}
    single, wide, small = prior("a1", {"a": 1}, 0.3, 10), prior("ab", {"a": 1, "b": 1, "c": 0}, 0.5, 20), \
        prior("c-", {"c": 2}, -0.2, 30)
    claims = prior_means([(wide, wide.changes), (single, single.changes), (small, small.changes)], stock)
    assert claims[("a", 1)] == (pytest.approx(math.log(1.3)), single)  # the single-knob prior claims its value
    assert claims[("b", 1)] == (pytest.approx(math.log(1.5) - math.log(1.3)), wide)  # the rest of the wide one
    assert ("c", 0) not in claims and ("c", 2) not in claims  # stock's value has no coefficient; no negative claims
    assert claimed_by({"a": 1, "b": 1}, claims, [{"a": 1, "b": 0}]) == [wide]  # a=1 was measured, b=1 not


def test_the_prior_mean_leads_the_upper_confidence_bound_until_evidence_contradicts_it():
    knobs = [Knob("x", "choice", "a", "", choices=("a", "b", "c")), Knob("y", "bool", False, "")]
    state = make_state(knobs)
    view = SearchView(state)
    ok = dict  # every change-set is measurable
    assert ucb_proposal(view, [], 1, ok)[0] == {"x": "b"}  # no prior mean: knob order, then value order
    assert ucb_proposal(view, [], 1, ok, prior_mean={("x", "c"): 0.2})[0] == {"x": "c"}
    # x=c measured 20% slower twice: the claim gives way to the values nobody has measured
    bad = [({"x": "c", "y": False}, math.log(0.8))] * 2
    assert ucb_proposal(view, bad, 1, ok, prior_mean={("x", "c"): 0.2})[0] == {"x": "b"}


def test_priors_in_the_model_take_no_slots_and_a_contradicted_prior_is_dropped():
    """compile measured 30% slower: with slots, the priors that hold compile_mode=default
    still get their turns; in the model, the evidence outweighs their claims."""
    def run(orch):
        state = make_state(engine_knobs())
        out = []
        for i in range(8):
            p = orch.propose(state)
            out.append(p)
            compiled = {**state["stack"], **p["changes"]}["compile_mode"] == "default"
            feed(state, p, verdict="revert", ratio=0.7 if compiled else 0.97)
        return out

    model = run(RuleOrchestrator(feasible=lambda cfg: True, priors="model"))
    first = model[0]
    assert first["changes"] == {"compile_mode": "default"} and first["source"] == "prior"
    assert "expert prior 'compile'" in first["rationale"] and first["predicted_gain"] == pytest.approx(0.3)
    assert not any(p["changes"].get("compile_mode") == "default" for p in model[1:])
    assert any(p["source"] == "search" for p in model)
    slots = run(RuleOrchestrator(feasible=lambda cfg: True, priors="slots"))
    assert any(p["changes"].get("compile_mode") == "default" for p in slots[1:])  # static-cache+compile's turn


def test_the_default_keeps_the_priors_in_slots():
    """Priors in the model is opt-in: slower on the real engine's table (docs/benchmarks.md section 16) and
    on fresh prior-aligned seeds 200-209 (section 10)."""
    assert RuleOrchestrator(feasible=lambda cfg: True).priors == "slots"
    assert RuleOrchestrator().priors == "slots"
    with pytest.raises(ValueError, match="priors must be 'slots' or 'model'"):
        RuleOrchestrator(priors="auto")


def test_priors_in_the_model_need_the_models_search():
    with pytest.raises(ValueError, match="priors must be 'slots' or 'model'"):
        RuleOrchestrator(priors="model", search="tpe")
