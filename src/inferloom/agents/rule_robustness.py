"""The deterministic circuit breaker (see ``inferloom.agents.rules``)."""

from __future__ import annotations

import json
from typing import Any, Mapping

__all__ = ["RuleRobustness"]


class RuleRobustness:
    """Circuit breaker over the state (see the module docstring).

    Rules, checked in this order, each giving ``{"action": "end_phase", "rule",
    "reason"}``: ``consecutive_failures`` (the last ``max_consecutive_failures``
    trials of this cycle all have a verdict in ``failure_verdicts``),
    ``repeated_proposal`` (the last two of ``state["proposals"]`` are the same
    change-set), ``no_progress`` (``now`` minus the latest of ``started_at``,
    ``cycle_started_at`` and the last keep's ``finished_at`` exceeds
    ``stall_minutes``). Trials carrying a ``cycle`` key count only when it
    equals ``state["cycle"]``, so a new cycle starts with a clean slate."""

    name = "rule-robustness"

    def __init__(self, max_consecutive_failures: int = 3, stall_minutes: float = 30.0,
                 failure_verdicts: tuple[str, ...] = ("failed", "refused")) -> None:
        if max_consecutive_failures < 1 or stall_minutes <= 0:
            raise ValueError("RuleRobustness: need max_consecutive_failures >= 1 and stall_minutes > 0")
        self.max_consecutive_failures = int(max_consecutive_failures)
        self.stall_minutes = float(stall_minutes)
        self.failure_verdicts = tuple(failure_verdicts)

    def check(self, state: Mapping[str, Any], now: float) -> dict[str, str] | None:
        trials = [t for t in state.get("trials", []) if isinstance(t, Mapping)]
        cycle = state.get("cycle")
        current = [t for t in trials if "cycle" not in t or t["cycle"] == cycle]
        n = self.max_consecutive_failures
        tail = current[-n:]
        if len(tail) == n and all(t.get("verdict") in self.failure_verdicts for t in tail):
            return {"action": "end_phase", "rule": "consecutive_failures",
                    "reason": f"the last {n} trials failed ({', '.join(str(t.get('verdict')) for t in tail)})"}

        props = [p.get("changes", p) if isinstance(p, Mapping) else p for p in state.get("proposals") or []]
        if len(props) >= 2 and _canon(props[-1]) == _canon(props[-2]):
            return {"action": "end_phase", "rule": "repeated_proposal",
                    "reason": f"the same change-set was proposed twice in a row: {_canon(props[-1])}"}

        marks = [state.get("started_at"), state.get("cycle_started_at")]
        marks += [t.get("finished_at") for t in trials if t.get("verdict") == "keep"]
        marks = [float(m) for m in marks if isinstance(m, (int, float)) and not isinstance(m, bool)]
        if marks and now - max(marks) > self.stall_minutes * 60.0:
            return {"action": "end_phase", "rule": "no_progress",
                    "reason": f"no keep for {(now - max(marks)) / 60.0:.1f} min "
                    f"(limit {self.stall_minutes:g} min)"}
        return None


def _canon(x: Any) -> str:
    return json.dumps(x, sort_keys=True, default=str)
