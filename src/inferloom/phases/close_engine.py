"""CLOSE for a session with engine patches (``serving.engine_patches``): the final stack against stock, its
roofline (as any configuration's: :func:`~inferloom.phases.close.final_compare`), then, when the final stack
keeps an engine patch, the rollback drill: the stack without the overlay is stock's configuration started
afresh (a stock start after the patched ones; the overlay is dropped from the launch, the installed package
never changed), measured against stock, paired. It passes when every stock start carried no source overlay,
the installed files the patch was built on kept their recorded sha256 (``vllm_engine_patches.rollback_check``)
and the interval meets stock's own A/A band widened to the smallest gain a keep needs, as a custom session's
drill (``custom_close``)."""

from __future__ import annotations

import time
from typing import Any

from inferloom.measure.compare import compare
from inferloom.measure.keep_rule import rollback_band
from inferloom.measure.protocol import with_prior
from inferloom.phases.close import final_compare
from inferloom.phases.common import seed_base, step_key
from inferloom.phases.context import SessionContext
from inferloom.phases.trial import noise_floor_gain
from inferloom.session import ledger as L
from inferloom.session.state import SessionState
from inferloom.session.state_models import RollbackDrill
from inferloom.workloads.base import EnginePatches, config_key
from inferloom.workloads.vllm_engine_patches import rollback_check

__all__ = ["ROLLBACK", "engine_close"]

ROLLBACK = "rollback_drill"  # ledger kind, as a custom session's drill


def engine_close(ctx: SessionContext, st: SessionState) -> None:
    """The final comparison, then the rollback drill when an engine patch is kept."""
    final_compare(ctx, st)
    if not isinstance(ctx.adapter, EnginePatches):
        return
    value = str(st.stack.get(ctx.adapter.engine_patch_knob, "none"))
    if value != "none" and st.extra.rollback_drill is None:
        _drill(ctx, st, ctx.adapter.engine_patch_knob, value)


def _drill(ctx: SessionContext, st: SessionState, knob: str, value: str) -> None:
    ctx.progress(f"CLOSE: rollback drill: {knob}={value} dropped (a stock start without the overlay), measured "
                 "against stock")
    key = step_key("engine_rollback_drill", st.session_id, value)
    t0 = time.perf_counter()
    res, mseq = ctx.measured(key + ":measurement", L.MEASUREMENT, lambda: {
        "action": "rollback_drill", "rolled_back": {knob: value}, **compare(
            ctx.adapter, ctx.spec, st.stock_config, dict(st.stock_config),
            settings=with_prior(ctx.settings, st.noise_floor), seed_base=seed_base(ctx.spec.seed, 95_000),
            refs=ctx.refs, quality_sets=("heldout",), progress=ctx.progress,
            labels=("stock", "rolled-back")).as_dict()})
    ctx.record_server_starts()
    kept = next((e for e in reversed(ctx.ledger.entries("patch")) if e.get("id") == value and e.get("kept")), {})
    clean, checked = rollback_check(kept.get("overlay") or {}, config_key(st.stock_config),
                                    ctx.ledger.entries(L.SERVER_START))
    d = (res.get("protocol") or {}).get("decision") or {}
    within, band, tol = rollback_band(d, st.noise_floor, min_gain=ctx.spec.protocol.min_gain, floor=noise_floor_gain(st))
    lo, hi = d.get("ci_low"), d.get("ci_high")
    passed = bool(clean and res.get("verdict") not in (None, "failed") and within)
    why = (f"{checked}; the objective is back within the noise floor" if passed else
           (checked if not clean else res.get("error") or ("the measurement has no interval" if lo is None or hi is None
                                                           else f"the interval [{lo:.3f}, {hi:.3f}] misses stock's "
                                                                f"own band [{band[0]:.3f}, {band[1]:.3f}]")))
    out: dict[str, Any] = {"passed": passed, "why": why, "reverted": [f"{knob}={value}"], "tree_identical": clean,
                           "engine_patch": value, "ratio": d.get("ratio"), "ci_low": lo, "ci_high": hi,
                           "n_pairs": d.get("n_pairs"), "tolerance": tol, "band": band,
                           "quality_passed": (res.get("quality") or {}).get("passed"), "measurement_seq": mseq,
                           "seconds": time.perf_counter() - t0}
    seq = ctx.ledger.append(ROLLBACK, out, key=key)
    st.extra.rollback_drill = RollbackDrill(passed=passed, ledger_seq=seq)
    ctx.progress(f"CLOSE: rollback drill {'PASSED' if passed else 'FAILED'}: {why}")
