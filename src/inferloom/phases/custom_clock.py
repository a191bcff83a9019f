"""A patch's keep stands only if inferloom's own clock doesn't contradict it.

The guard :func:`clock_guard` gives :func:`inferloom.phases.trial.execute_trial`
for a custom workload's patch: it reads the patch's measurement and the
session's A/A (stock's measurement) from the ledger and applies
:func:`inferloom.measure.clock_check.clock_check` (the rule, its numbers, and
why). See docs/custom.md ("Checked by inferloom's clock").
"""

from __future__ import annotations

from typing import Any, Mapping

from inferloom.measure.clock_check import clock_check
from inferloom.phases.context import SessionContext
from inferloom.phases.trial import Guard
from inferloom.session import ledger as L

__all__ = ["clock_guard"]


def clock_guard(ctx: SessionContext, key: str, pid: str, out: dict[str, Any]) -> Guard:
    """A patch's keep stands only if inferloom's own clock doesn't contradict the
    objective's claimed gain (measure/clock_check.py); the check lands in ``out``."""
    def check(_ev: Mapping[str, Any]) -> tuple[str, str] | None:
        meas = ctx.ledger.find(key + ":measurement") or {}
        aa = next((e for e in ctx.ledger.entries(L.MEASUREMENT) if e.get("action") == "measure_stock"), {})
        res = clock_check((meas.get("protocol") or {}).get("pairs") or [],
                          noise_pairs=(aa.get("protocol") or {}).get("pairs") or [])
        out.update(res.to_dict())
        return (res.rule, f"patch {pid}: {res.why}") if res.rule else None
    return check
