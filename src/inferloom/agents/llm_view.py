"""The session's view an LLM-backed role is given, built from the state dict
alone (``state.json`` as loaded, the same dict the deterministic agents read):
the workload and device, the profile and roofline, the stock configuration and
the current stack, every measured candidate (kept and rejected, with its
verdict, ratio, interval, quality and the rule or lesson that decided it), the
knowledge base's failed recipes, the knob space with each knob's domain, the
noise floor and the remaining budget. Compact JSON: it is the prompt's body.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

__all__ = ["session_view", "view_text"]

_MAX_TRIALS = 40  # the most recent trials shown (older ones are counted)


def _knob(k: Mapping[str, Any]) -> dict[str, Any]:
    out = {"name": k.get("name"), "kind": k.get("kind"), "default": k.get("default"),
           "description": k.get("description", "")}
    if k.get("kind") == "choice":
        out["choices"] = list(k.get("choices") or [])
    elif k.get("kind") == "int":
        out["low"], out["high"] = k.get("low"), k.get("high")
    if k.get("changes_numerics"):
        out["changes_numerics"] = True
    return out


def session_view(state: Mapping[str, Any], *, phase: str = "FRAMEWORK") -> dict[str, Any]:
    """The view (see the module docstring); ``phase``: whose knobs are searchable."""
    device = state.get("device", "cpu")
    pinned = dict(state.get("pinned") or {})
    knobs = [_knob(k) for k in state.get("knobs") or [] if isinstance(k, Mapping)
             and device in (k.get("applies_to") or (device,)) and k.get("name") not in pinned
             and k.get("phase", "FRAMEWORK") == phase]
    trials = [t for t in state.get("trials") or [] if isinstance(t, Mapping)]
    shown = [{k: t.get(k) for k in ("trial", "cycle", "changes", "verdict", "kept", "ratio", "ci_low", "ci_high",
                                    "quality_passed", "lesson")} for t in trials[-_MAX_TRIALS:]]
    extra = state.get("extra") or {}
    budget, used = state.get("budget") or {}, state.get("used") or {}
    prof = extra.get("profile") or {}
    return {
        "phase": state.get("phase"), "cycle": state.get("cycle"), "device": device,
        "workload": state.get("workload") or {},
        "profile": {"categories": prof.get("categories"), "skipped": prof.get("skipped")} if prof else None,
        "roofline": extra.get("roofline_stock"), "ceilings": extra.get("ceilings"),
        "stock_config": state.get("stock_config") or {}, "stack": state.get("stack") or {},
        "stack_gain_over_stock": extra.get("stack_ratio"), "pinned": pinned,
        "knob_space": knobs, "noise_floor": state.get("noise_floor"),
        "trials": shown, "older_trials_not_shown": max(0, len(trials) - _MAX_TRIALS),
        "measured_configurations": len(state.get("measured_config_keys") or []),
        "kb_failed_recipes": list(extra.get("kb_failures") or state.get("kb_failures") or []),
        "warm_replay": extra.get("warm_replay"),
        "rejected_server_flags": sorted((extra.get("rejected_flags") or {}).keys()),
        "budget_left": {"trials": max(0, int(budget.get("trials") or 0) - int(used.get("trials") or 0)),
                        "minutes": max(0.0, float(budget.get("minutes") or 0) - float(used.get("elapsed_s") or 0)
                                       / 60.0)},
    }


def view_text(view: Mapping[str, Any]) -> str:
    return json.dumps(view, sort_keys=True, default=str, separators=(",", ":"))
