"""Phase allowlists and the validation of an agent's output: every refusal
has a rule name that goes into the ledger."""

from __future__ import annotations

from typing import Any, Mapping

from inferloom.agents.base import ACTIONS
from inferloom.agents.search_view import redundant, stock_runs
from inferloom.workloads.base import ConfigError, config_key, resolve_config

__all__ = ["PHASE_ALLOWLIST", "MAX_CONSECUTIVE_REFUSALS", "validate_proposal"]

# Which action each phase admits. Anything else is refused with rule
# "action_not_allowed_in_phase" and the refusal goes into the ledger.
PHASE_ALLOWLIST: dict[str, frozenset[str]] = {
    "PRELUDE": frozenset({"measure_stock"}),
    "ENABLEMENT": frozenset({"enablement_rung", "stop"}),
    "FRAMEWORK": frozenset({"try_config", "end_phase", "stop"}),
    "KERNEL": frozenset({"skip_phase", "try_kernel"}),
    "SWEEP": frozenset({"sweep", "skip_phase"}),
    "CLOSE": frozenset({"final_compare", "write_artifacts"}),
}

MAX_CONSECUTIVE_REFUSALS = 5


def validate_proposal(raw: Any, phase: str, state: Mapping[str, Any], knobs: list[Any]) -> tuple[dict[str, Any] | None, str | None, str]:
    """Check an agent's output. Returns (proposal, None, "") or (None, rule, why)."""
    if not isinstance(raw, Mapping):
        return None, "malformed_output", f"expected a mapping, got {type(raw).__name__}"
    refused = raw.get("refused")
    if isinstance(refused, Mapping) and isinstance(refused.get("rule"), str) and refused["rule"].startswith("llm_"):
        # an LLM-backed agent that got nothing usable names why (inferloom.agents.llm_client)
        return None, refused["rule"], str(refused.get("why") or "")
    action = raw.get("action")
    if action not in ACTIONS:
        return None, "unknown_action", f"action {action!r} is not one of {', '.join(ACTIONS)}"
    if action not in PHASE_ALLOWLIST.get(phase, frozenset()):
        return None, "action_not_allowed_in_phase", f"{action!r} is not allowed in {phase}"
    if action not in ("try_config", "try_kernel"):
        return dict(raw), None, ""
    changes = raw.get("changes")
    if not isinstance(changes, Mapping) or not changes:
        return None, "malformed_output", f"{action} needs a non-empty 'changes' mapping"
    by_name = {k.name: k for k in knobs}
    for name in changes:
        if name not in by_name:
            return None, "unknown_knob", f"knob {name!r} is not in the knob space"
        if state.get("device") not in by_name[name].applies_to:
            return None, "knob_not_applicable", f"knob {name!r} does not apply to {state.get('device')}"
        if name in (state.get("pinned") or {}):
            return None, "pinned_knob", f"knob {name!r} is pinned by the spec"
        if by_name[name].phase != phase:
            return None, "knob_not_in_phase", f"knob {name!r} belongs to the {by_name[name].phase} phase, not {phase}"
        for flag, info in ((state.get("extra") or {}).get("rejected_flags") or {}).items():
            if info.get("knob") == name and (info.get("whole_flag") or info.get("value") == changes[name]):
                return None, "rejected_by_server", (f"knob {name!r}={changes[name]!r}: the installed server rejected "
                                                    f"{flag} earlier in this session")
    try:
        full = resolve_config(knobs, {**state["stack"], **dict(changes)}, state.get("pinned") or {})
    except ConfigError as exc:
        return None, "bad_value", str(exc)
    if full == state["stack"]:
        return None, "no_change", "the changes equal the current stack"
    same = redundant({k: full[k] for k in changes}, state["stack"], state.get("stock_config") or {}, stock_runs(state))
    if len(same) == len(changes):
        runs = (state.get("extra") or {}).get("stock_runs") or {}
        return None, "stock_runs_it", "; ".join(f"{k}={v!r}: the stock server already runs it (its log: "
                                                f"{runs[k].get('said', '?')!r})" for k, v in same.items())
    if config_key(full) in state.get("measured_config_keys", []):
        return None, "already_measured", f"{config_key(full)} was measured before"
    pg = raw.get("predicted_gain")
    if pg is not None and not isinstance(pg, (int, float)):
        return None, "malformed_output", "predicted_gain must be a number or null"
    return {**dict(raw), "changes": dict(changes), "config": full}, None, ""
