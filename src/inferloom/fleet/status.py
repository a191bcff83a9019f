"""Where each session of a fleet stands, read from its directory (state on disk is the source of truth).

A session is ``pending`` (no state.json yet), ``running`` (state.json, phase not
DONE), ``done`` (phase DONE) or ``failed`` (its last fleet attempt raised; the
error is in ``OUT/logs/NAME.result.json``). A rerun of the fleet skips ``done``,
resumes ``running`` and ``failed`` ones that have a state, and starts the rest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferloom.fleet.plan import FleetPlan, PlannedSession

__all__ = ["SessionStatus", "session_status", "fleet_status", "result_path", "log_path", "worker_path"]


def log_path(plan: FleetPlan, name: str) -> Path:
    return plan.out / "logs" / f"{name}.log"


def result_path(plan: FleetPlan, name: str) -> Path:
    return plan.out / "logs" / f"{name}.result.json"


def worker_path(plan: FleetPlan, name: str) -> Path:
    return plan.out / "logs" / f"{name}.worker.json"


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@dataclass
class SessionStatus:
    name: str
    status: str                          # pending | running | done | failed
    phase: str | None = None
    session_id: str | None = None
    trials_used: int = 0
    elapsed_s: float = 0.0
    stop_reason: str | None = None
    error: str | None = None
    state: dict[str, Any] = field(default_factory=dict)
    breakdown: dict[str, Any] | None = None

    def line(self) -> str:
        """One progress line."""
        if self.status == "pending":
            return f"{self.name}: pending"
        if self.status == "failed":
            return f"{self.name}: failed: {self.error}"
        head = f"{self.name}: {self.phase}, {self.trials_used} trials, {self.elapsed_s / 60:.1f} min"
        return head + (f"; done: {self.stop_reason}" if self.status == "done" else "")


def session_status(plan: FleetPlan, s: PlannedSession) -> SessionStatus:
    d = plan.session_dir(s)
    st = _json(d / "state.json")
    res = _json(result_path(plan, s.name)) or {}
    if not isinstance(st, dict):
        if res.get("ok") is False:
            return SessionStatus(s.name, "failed", error=res.get("error"))
        return SessionStatus(s.name, "pending")
    used = st.get("used") or {}
    out = SessionStatus(s.name, "running", phase=st.get("phase"), session_id=st.get("session_id"),
                        trials_used=int(used.get("trials") or 0), elapsed_s=float(used.get("elapsed_s") or 0.0),
                        stop_reason=st.get("stop_reason"), state=st)
    if st.get("phase") == "DONE":
        out.status = "done"
        b = _json(d / "session_breakdown.json")
        out.breakdown = b if isinstance(b, dict) else None
    elif res.get("ok") is False and res.get("session_id") == out.session_id:
        out.status, out.error = "failed", res.get("error")
    return out


def fleet_status(plan: FleetPlan) -> list[SessionStatus]:
    return [session_status(plan, s) for s in plan.sessions]
