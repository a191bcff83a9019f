"""RuleOrchestrator(prior_tries=N) (agents/search_moves.spent; "auto", the default: 1 with the cross-knob
rules, None without): a prior whose change-set N trials already measured as a change gets no more slots;
a failed or refused try does not count."""

from __future__ import annotations

from inferloom.agents.priors import Prior
from inferloom.agents.rules import RuleOrchestrator
from inferloom.agents.search_moves import spent
from inferloom.agents.search_view import SearchView
from inferloom.workloads.base import Knob

from test_agents import feed, make_state

CPU = frozenset({"cpu"})
KNOBS = [Knob("x", "choice", "a", "", choices=("a", "b", "c")), Knob("y", "choice", "a", "", choices=("a", "b", "c")),
         Knob("z", "bool", False, "")]
PRIORS = [Prior("x-b", {"x": "b"}, 0.2, "x-b (test)", CPU, 10), Prior("z-on", {"z": True}, 0.1, "z-on (test)", CPU, 20)]


def session(prior_tries, first_verdict="revert"):
    """The first prior measured (``first_verdict``), then y=b kept; the next proposal."""
    o = RuleOrchestrator(prior_table=PRIORS, prior_tries=prior_tries)
    state = make_state(KNOBS)
    p = o.propose(state)
    assert p["source"] == "prior" and p["changes"] == {"x": "b"}
    feed(state, p, verdict=first_verdict, ratio=None if first_verdict == "failed" else 0.99)
    feed(state, {"changes": {"y": "b"}}, verdict="keep", ratio=1.2)  # the stack moved: x=b is unmeasured there
    return o.propose(state), state


def test_a_prior_measured_once_is_not_proposed_again_at_a_new_stack():
    again, _ = session(None)
    assert again["changes"] == {"x": "b"} and "x-b" in again["rationale"]  # the slots retry it (the default)
    nxt, state = session(1)
    assert nxt["changes"] == {"z": True} and "z-on" in nxt["rationale"]  # spent: the next prior instead
    assert spent(SearchView(state), {"x": "b"}) and not spent(SearchView(state), {"x": "b"}, tries=2)


def test_a_failed_try_does_not_spend_the_prior():
    _, state = session(1, first_verdict="failed")
    assert not spent(SearchView(state), {"x": "b"})  # a failure says nothing of its gain at another stack


def test_auto_spends_priors_after_one_try_only_with_the_cross_knob_rules():
    assert RuleOrchestrator(feasible=lambda cfg: True).prior_tries == 1
    assert RuleOrchestrator().prior_tries is None
