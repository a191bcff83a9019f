"""CLOSE for a custom workload: the final stack against stock (each in its
own tree: the kept commits plus the configuration), then the rollback drill:
the kept commits reverted in ``trees/rollback``, checked to give stock's
exact tree, and measured against stock (paired); it passes when its interval
meets stock's own A/A band (at least the smallest gain a keep needs, ``(1 +
min_gain)(1 + floor)``, either side of x1)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from inferloom.measure.keep_rule import rollback_band
from inferloom.measure.protocol import with_prior
from inferloom.patches.worktree import Workspace
from inferloom.phases.common import seed_base as _seed_base
from inferloom.phases.common import step_key as _key
from inferloom.measure.compare import compare
from inferloom.phases.context import SessionContext
from inferloom.phases.custom_stack import source_state, workspace
from inferloom.phases.trial import noise_floor_gain
from inferloom.session import ledger as L
from inferloom.session.state import SessionState
from inferloom.session.state_models import RollbackDrill
from inferloom.workloads.custom import TREE_KEY

__all__ = ["ROLLBACK", "custom_close"]

ROLLBACK = "rollback_drill"  # ledger kind: the rollback drill's result


def custom_close(ctx: SessionContext, st: SessionState) -> None:
    """The final stack vs stock (each in its own tree), then the rollback drill."""
    src = source_state(st)
    ws = workspace(ctx, st)
    changed = st.stack != st.stock_config or src.stack != src.stock
    if not changed:
        return
    stock_tree = ws.tree("stock", src.stock)
    stack_tree = ws.tree("stack", src.stack)
    key = _key("final_compare", st.session_id, sorted(st.stack.items()), src.stack)
    ctx.progress("CLOSE: final stack (kept commits + configuration) against stock, paired, quality gate on each run")
    ctx.measured(key, L.MEASUREMENT, lambda: {
        "action": "final_compare", "stock_commit": src.stock, "stack_commit": src.stack, **compare(
            ctx.adapter, ctx.spec, {**st.stock_config, TREE_KEY: str(stock_tree)}, {**st.stack, TREE_KEY: str(stack_tree)},
            settings=with_prior(ctx.settings, st.noise_floor), seed_base=_seed_base(ctx.spec.seed, 90_000),
            refs=ctx.refs, quality_sets=("heldout",),
            progress=ctx.progress, labels=("stock", "final")).as_dict()})
    if src.kept and st.extra.rollback_drill is None:
        _rollback_drill(ctx, st, ws, stock_tree)
    for name in ("candidate", "rollback"):
        ws.remove(name)


def _rollback_drill(ctx: SessionContext, st: SessionState, ws: Workspace, stock_tree: Path) -> None:
    src = source_state(st)
    shas = [k.sha for k in src.kept]
    ctx.progress(f"CLOSE: rollback drill: revert {len(shas)} kept commit(s) in a scratch tree, then measure against stock")
    key = _key("rollback_drill", st.session_id, src.stack)
    t0 = time.perf_counter()
    try:
        rb = ws.revert("rollback", src.stack, shas)
        identical = ws.tree_id(rb) == ws.tree_id(src.stock)
        err = None
    except Exception as exc:  # noqa: BLE001 - a failed revert is the drill's result, not a crash
        rb, identical, err = None, False, f"{type(exc).__name__}: {exc}"
    res: dict[str, Any] = {}
    mseq = None
    if rb is not None:
        rb_tree = ctx.dir / "workspace" / "trees" / "rollback"
        res, mseq = ctx.measured(key + ":measurement", L.MEASUREMENT, lambda: {
            "action": "rollback_drill", "rollback_commit": rb, **compare(
                ctx.adapter, ctx.spec, {**st.stock_config, TREE_KEY: str(stock_tree)},
                {**st.stock_config, TREE_KEY: str(rb_tree)}, settings=with_prior(ctx.settings, st.noise_floor),
                seed_base=_seed_base(ctx.spec.seed, 95_000), refs=ctx.refs, quality_sets=("heldout",),
                progress=ctx.progress, labels=("stock", "rolled-back")).as_dict()})
    d = (res.get("protocol") or {}).get("decision") or {}
    within, band, tol = rollback_band(d, st.noise_floor, min_gain=ctx.spec.protocol.min_gain, floor=noise_floor_gain(st))
    lo, hi = d.get("ci_low"), d.get("ci_high")
    passed = bool(identical and res.get("verdict") not in (None, "failed") and within)
    why = ("the reverted tree is stock's and its objective is back within the noise floor" if passed else
           err or ("the reverted tree differs from stock's" if not identical else
                   res.get("error") or ("the measurement has no interval" if lo is None or hi is None else
                                         f"the interval [{lo:.3f}, {hi:.3f}] misses stock's own band "
                                         f"[{band[0]:.3f}, {band[1]:.3f}]")))
    out = {"passed": passed, "why": why, "reverted": shas, "rollback_commit": rb, "tree_identical": identical,
           "ratio": d.get("ratio"), "ci_low": lo, "ci_high": hi, "n_pairs": d.get("n_pairs"), "tolerance": tol, "band": band,
           "quality_passed": (res.get("quality") or {}).get("passed"), "measurement_seq": mseq,
           "seconds": time.perf_counter() - t0}
    seq = ctx.ledger.append(ROLLBACK, out, key=key)
    st.extra.rollback_drill = RollbackDrill(passed=passed, ledger_seq=seq)
    ctx.progress(f"CLOSE: rollback drill {'PASSED' if passed else 'FAILED'}: {why}")
