"""The platform audit at PRELUDE and CLOSE (:mod:`inferloom.platform_audit`, read-only): one
``platform_audit`` ledger entry each (idempotent: a resumed session does not take it twice); the CLOSE one
carries ``changes``, every stable setting that differs from PRELUDE's (a governor, a clock, a power limit
changed under the session), which the report flags."""

from __future__ import annotations

from inferloom.phases.common import step_key
from inferloom.phases.context import SessionContext
from inferloom.platform_audit import audit, audit_changes
from inferloom.session.state import SessionState

__all__ = ["PLATFORM_AUDIT", "record_audit"]

PLATFORM_AUDIT = "platform_audit"


def record_audit(ctx: SessionContext, st: SessionState, phase: str) -> None:
    key = step_key("platform-audit", st.session_id, phase)
    if ctx.ledger.has_key(key):
        return
    now = audit()
    payload = {"at_phase": phase, "audit": now}
    if phase == "CLOSE":
        first = next((e for e in ctx.ledger.entries(PLATFORM_AUDIT) if e.get("at_phase") == "PRELUDE"), None)
        if first is not None:
            payload["changes"] = audit_changes(first.get("audit") or {}, now)
            payload["prelude_seq"] = first["seq"]
            for c in payload["changes"]:
                ctx.progress(f"platform changed during the session: {c['what']}: {c['before']} -> {c['after']}")
    ctx.ledger.append(PLATFORM_AUDIT, payload, key=key)
