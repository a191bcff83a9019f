"""CLOSE: the final stack against stock once more (paired, quality on the
held-out set: the headline number), then ``session_breakdown.json`` and
``report.md`` (:mod:`inferloom.report`: pure functions of the ledger, so
``inferloom report DIR`` re-renders them from the ledger alone), then the
session's recipe in the knowledge base."""

from __future__ import annotations

from typing import Any

from inferloom.report.artifacts import write_artifacts
from inferloom.report.breakdown import breakdown_from_ledger
from inferloom.session import ledger as L
from inferloom.session.common import median_objective
from inferloom.session.common import seed_base as _seed_base
from inferloom.session.common import step_key as _key
from inferloom.session.compare import compare, stock_references
from inferloom.session.manifest import read_manifest
from inferloom.session.state import Phase, SessionState, load_state

__all__ = ["close_step"]


def close_step(c: Any, st: SessionState) -> None:
    custom = getattr(c.spec, "framework", None) == "custom"
    if custom:
        from inferloom.patches.session import custom_close

        custom_close(c, st)  # final comparison in the stock and stack trees, then the rollback drill
    if st.stack != st.stock_config and not custom:
        key = _key("final_compare", st.session_id, sorted(st.stack.items()))
        refs = stock_references(c.adapter, c.spec, st.stock_config, ("heldout",), c.refs, c.progress)
        c.progress("CLOSE: final stack against stock (paired, quality on the held-out set)")
        c._measured(key, L.MEASUREMENT, lambda: {
            "action": "final_compare", **compare(
                c.adapter, c.spec, st.stock_config, st.stack, settings=c.settings,
                seed_base=_seed_base(c.spec.seed, 90_000), refs=refs, quality_sets=("heldout",), progress=c.progress,
                labels=("stock", "final"))})
    if st.stack != st.stock_config and "roofline_final" not in st.extra and not custom:
        _final_roofline(c, st)
    st.stop_reason = st.stop_reason or "converged"
    elapsed = st.used.elapsed_s + max(0.0, c.clock() - c._tick_t)
    c.ledger.append(L.CLOSE, {"stop_reason": st.stop_reason, "stock_config": st.stock_config,
                              "final_config": st.stack, "elapsed_s": elapsed, "trials": st.used.trials,
                              "cycles": st.cycle}, key=_key("close", st.session_id))
    c._phase(st, Phase.DONE, f"closed: {st.stop_reason}")
    write_artifacts(c.dir)
    _record_recipe(c)


def _final_roofline(c: Any, st: SessionState) -> None:
    """Where the final stack sits against the roofline; a gain the roofline
    (or Amdahl's law over the stock headroom) can't allow is flagged suspect."""
    from inferloom.measure.roofline import amdahl_check
    from inferloom.session.prelude import ROOFLINE, roofline_for

    final = next((e for e in reversed(c.ledger.entries(L.MEASUREMENT)) if e.get("action") == "final_compare"), None)
    if not final or not final.get("protocol"):
        return
    tok = median_objective(final, "value_b")
    roof = roofline_for(c, st, tok, st.stack)
    ratio = (_decision(final) or {}).get("ratio")
    head = (st.extra.get("roofline_stock") or {}).get("headroom")
    check = amdahl_check(ratio, head) if ratio and head else None
    seq = c.ledger.append(ROOFLINE, {"final": roof, "amdahl": check}, key=_key("roofline-final", st.session_id))
    st.extra["roofline_final"] = {"ledger_seq": seq, "fraction": (roof or {}).get("fraction"),
                                  "suspect": bool((roof or {}).get("suspect") or (check or {}).get("suspect"))}


def _record_recipe(c: Any) -> None:
    """File the session in the knowledge base (strict: only a paired,
    quality-passing final comparison enters as a winner). A KB problem is
    reported, never allowed to lose the session's own artifacts."""
    if not getattr(c, "kb_url", None):
        return
    from inferloom.kb import KBError, RecipeStore

    try:
        with RecipeStore(c.kb_url) as store:
            key, res = store.record_closed_session(state=load_state(c.dir), manifest=read_manifest(c.dir),
                                                   breakdown=breakdown_from_ledger(L.read_entries(c.dir)))
        c.progress(f"knowledge base: recipe #{res.recipe_id} for {key.model} on {key.hardware}: "
                   + ("winner entered" if res.winner_entered else f"no winner ({res.reason})"))
    except KBError as exc:
        c.progress(f"knowledge base: not written: {exc}")


def _decision(m: dict[str, Any]) -> dict[str, Any]:
    return (m.get("protocol") or {}).get("decision") or {}
