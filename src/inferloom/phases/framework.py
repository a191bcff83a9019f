"""FRAMEWORK phase (configuration search): one tick = one robustness check,
one orchestrator proposal (validated against the allowlist and the knob
space), and at most one measured trial (:mod:`inferloom.phases.trial`).
How much of the session's budget it may use is the coordinator's split
(:mod:`inferloom.phases.budget`), asked before each tick.
"""

from __future__ import annotations

from typing import Any, Mapping

from inferloom.phases.allowlist import MAX_CONSECUTIVE_REFUSALS, validate_proposal
from inferloom.phases.common import agent_view, jsonable, step_key
from inferloom.phases.context import SessionContext
from inferloom.phases.trial import execute_trial, run_trial
from inferloom.session import ledger as L
from inferloom.session.state import Phase, SessionState
from inferloom.workloads.base import config_key

__all__ = ["framework_step"]


def _input_ref(st: SessionState) -> dict[str, Any]:
    """How an agent's input is recorded: the state it read is state.json at this
    point, identified by the ledger seq it had reached and its counters."""
    return {"state_last_ledger_seq": st.last_ledger_seq, "phase": st.phase.value, "cycle": st.cycle,
            "trials": len(st.trials), "stack": dict(st.stack)}


def _tick_key(st: SessionState, what: str) -> str:
    return step_key(what, st.session_id, st.cycle, len(st.trials), st.extra.refusals_total or 0)


def framework_step(ctx: SessionContext, st: SessionState) -> None:
    """One FRAMEWORK tick of the configuration search."""
    if st.pending_action is not None and st.pending_action.action == "try_config":
        execute_trial(ctx, st, dict(st.pending_action.params), st.pending_action.key)
        return
    view = agent_view(st)
    robustness, orchestrator = ctx.agents.robustness, ctx.agents.orchestrator
    forced = robustness.check(view, ctx.clock())
    if forced is not None:
        ctx.ledger.append(L.AGENT_IO, {"agent": robustness.name, "role": "robustness", "input": _input_ref(st),
                                       "output": jsonable(forced)},
                          key=_tick_key(st, "robustness"))
        if not isinstance(forced, Mapping) or forced.get("action") not in ("end_phase", "stop"):
            ctx.refuse(st, "malformed_output", "robustness must return end_phase or stop", forced, robustness.name)
            st.extra.refusals_total = (st.extra.refusals_total or 0) + 1
            return
        why = f"robustness ({forced.get('rule', '?')}): {forced.get('reason', '')}"
        if forced["action"] == "stop":
            st.stop_reason = why
            ctx.enter_phase(st, Phase.CLOSE, why)
        else:
            _end(ctx, st, why)
        return
    if (st.extra.refusals_in_a_row or 0) >= MAX_CONSECUTIVE_REFUSALS:
        _end(ctx, st, f"coordinator (refusal_limit): {MAX_CONSECUTIVE_REFUSALS} consecutive refused proposals")
        return

    try:
        raw = orchestrator.propose(view)
    except Exception as exc:  # noqa: BLE001 - an agent's crash is a refusal, not the session's end
        raw = {"error": f"{type(exc).__name__}: {exc}"}
    ctx.ledger.append(L.AGENT_IO, {"agent": orchestrator.name, "role": "orchestrator", "input": _input_ref(st),
                                   "output": jsonable(raw)},
                      key=_tick_key(st, "orchestrator"))
    proposal, rule, why = validate_proposal(raw, "FRAMEWORK", view, ctx.knobs)
    if rule:
        ctx.refuse(st, rule, why, raw, orchestrator.name)
        st.extra.refusals_total = (st.extra.refusals_total or 0) + 1
        return
    st.extra.refusals_in_a_row = 0
    if proposal["action"] == "end_phase":
        _end(ctx, st, f"orchestrator: {proposal.get('rationale', 'nothing left to try')}")
        return
    if proposal["action"] == "stop":
        st.stop_reason = f"orchestrator asked to stop: {proposal.get('rationale', '')}"
        ctx.enter_phase(st, Phase.CLOSE, st.stop_reason)
        return

    key = step_key("try_config", st.session_id, st.cycle, config_key(proposal["config"]))
    st.extra.add_proposal(proposal["changes"])
    run_trial(ctx, st, proposal, key, action="try_config")


def _end(ctx: SessionContext, st: SessionState, why: str) -> None:
    st.extra.proposals = []
    ctx.enter_phase(st, Phase.KERNEL, why)
