"""CLOSE: the workload strategy's final measurements (the final stack against
stock once more, paired, quality on the held-out set: the headline number),
the ledger's close entry, then ``session_breakdown.json`` and ``report.md``
(pure functions of the ledger), and the session filed in the knowledge base.
A KB write that fails is an ``error`` ledger entry (``failure``:
:data:`KB_WRITE_FAILED`: what failed, what to do) and the report is rendered
again so that it says so."""

from __future__ import annotations

from typing import Any

from inferloom.kb import KBError, RecipeStore
from inferloom.measure.roofline import amdahl_check
from inferloom.measure.metrics import median_objective
from inferloom.measure.protocol import with_prior
from inferloom.phases.audit import record_audit
from inferloom.phases.common import seed_base as _seed_base
from inferloom.phases.common import step_key as _key
from inferloom.measure.compare import compare, reference_sets, stock_references
from inferloom.phases.context import SessionContext
from inferloom.phases.roofline import ROOFLINE, roofline_for
from inferloom.session import ledger as L
from inferloom.report.artifacts import write_artifacts
from inferloom.report.breakdown import breakdown_from_ledger
from inferloom.session.manifest import read_manifest
from inferloom.session.state import Phase, SessionState, load_state
from inferloom.session.state_models import RooflineFinal

__all__ = ["close_step", "final_compare", "KB_WRITE_FAILED"]

KB_WRITE_FAILED = "kb_write"  # the ``failure`` of the error entry a failed KB write at CLOSE leaves


def close_step(ctx: SessionContext, st: SessionState) -> None:
    """The whole CLOSE phase in one tick (each measurement is reused from the ledger after a crash)."""
    ctx.strategy.close_measure(ctx, st)
    record_audit(ctx, st, "CLOSE")
    st.stop_reason = st.stop_reason or "converged"
    ctx.ledger.append(L.CLOSE, {"stop_reason": st.stop_reason, "stock_config": st.stock_config,
                                "final_config": st.stack, "elapsed_s": ctx.elapsed_s(st), "trials": st.used.trials,
                                "cycles": st.cycle}, key=_key("close", st.session_id))
    ctx.enter_phase(st, Phase.DONE, f"closed: {st.stop_reason}")
    write_artifacts(ctx.dir)
    if _record_recipe(ctx, st) is not None:
        write_artifacts(ctx.dir)  # the report says the recipe was not filed


def final_compare(ctx: SessionContext, st: SessionState) -> None:
    """A configuration-only workload's CLOSE measurements: when anything was
    kept, the final stack against stock, then where it sits on the roofline."""
    if st.stack == st.stock_config:
        return
    key = _key("final_compare", st.session_id, sorted(st.stack.items()))
    refs = stock_references(ctx.adapter, ctx.spec, st.stock_config, reference_sets(ctx.adapter, ("heldout",)), ctx.refs,
                            ctx.progress)
    ctx.progress("CLOSE: final stack against stock (paired, quality on the held-out set)")
    ctx.measured(key, L.MEASUREMENT, lambda: {
        "action": "final_compare", **compare(
            ctx.adapter, ctx.spec, st.stock_config, st.stack, settings=with_prior(ctx.settings, st.noise_floor),
            seed_base=_seed_base(ctx.spec.seed, 90_000), refs=refs, quality_sets=("heldout",), progress=ctx.progress,
            labels=("stock", "final"), quality_floor=(st.noise_floor or {}).get("quality")).as_dict()})
    if st.extra.roofline_final is None:
        _final_roofline(ctx, st)


def _final_roofline(ctx: SessionContext, st: SessionState) -> None:
    """Where the final stack sits against the roofline; a gain the roofline
    (or Amdahl's law over the stock headroom) can't allow is flagged suspect."""
    final = next((e for e in reversed(ctx.ledger.entries(L.MEASUREMENT)) if e.get("action") == "final_compare"), None)
    if not final or not final.get("protocol"):
        return
    tok = median_objective(final, "value_b")
    roof = roofline_for(ctx, st, tok, st.stack)
    ratio = (_decision(final) or {}).get("ratio")
    head = st.extra.roofline_stock.headroom if st.extra.roofline_stock is not None else None
    check = amdahl_check(ratio, head) if ratio and head else None
    seq = ctx.ledger.append(ROOFLINE, {"final": roof, "amdahl": check}, key=_key("roofline-final", st.session_id))
    st.extra.roofline_final = RooflineFinal(ledger_seq=seq, fraction=(roof or {}).get("fraction"),
                                            suspect=bool((roof or {}).get("suspect") or (check or {}).get("suspect")))


def _record_recipe(ctx: SessionContext, st: SessionState) -> int | None:
    """File the session in the knowledge base (strict: only a paired,
    quality-passing final comparison enters as a winner). A KB problem is
    recorded (an error ledger entry; its seq is returned), never allowed to
    lose the session's own artifacts."""
    if not ctx.kb_url:
        return None
    try:
        with RecipeStore(ctx.kb_url) as store:
            key, res = store.record_closed_session(state=load_state(ctx.dir), manifest=read_manifest(ctx.dir),
                                                   breakdown=breakdown_from_ledger(L.read_entries(ctx.dir)))
        ctx.progress(f"knowledge base: recipe #{res.recipe_id} for {key.model} on {key.hardware}: "
                     + ("winner entered" if res.winner_entered else f"no winner ({res.reason})"))
    except KBError as exc:
        ctx.progress(f"knowledge base: not written: {exc}")
        return ctx.ledger.append(L.ERROR, {
            "what": "the session was not filed in the knowledge base at CLOSE", "failure": KB_WRITE_FAILED,
            "error": str(exc), "todo": "fix the knowledge base named in the error; this session's results are complete "
                                       "here, but the next session of this workload can't warm-start from them"},
            key=_key("kb_write_failed", st.session_id))
    return None


def _decision(m: dict[str, Any]) -> dict[str, Any]:
    return (m.get("protocol") or {}).get("decision") or {}
