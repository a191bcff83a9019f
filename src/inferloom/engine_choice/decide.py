"""Which engine to deploy, from the cross-engine measurement alone: pure functions.

:func:`engine_decision` applies the protocol's rule in both directions to the measured interval of B/A (B the
protocol's candidate): **B faster** when the protocol kept B (the interval's lower end above ``(1 + min_gain)(1 +
floor)``, the session keep rule); **A faster** when the interval's upper end is below the inverse of that
threshold (the same rule read from the other side; a harm stop, which reverts only when every pair was far
slower, counts when even its fastest pair is below it); otherwise **no measured difference** by that margin. The
ratio and interval are always stated as faster over slower (or B over A when neither).

:func:`recommendation` says it in words: the engine to deploy and why, or, with no measured difference, what else
distinguishes the two (precision, quality agreement, ceiling fraction).
"""

from __future__ import annotations

from typing import Any, Mapping

from inferloom.measure.keep_rule import keep_threshold
from inferloom.report.fmt import number, ratio_x

__all__ = ["engine_decision", "recommendation"]


def engine_decision(measurement: Mapping[str, Any]) -> dict[str, Any]:
    """``{"outcome": "b_faster" | "a_faster" | "no_difference" | "failed", "faster", "slower", "ratio",
    "ci_low", "ci_high", "n_pairs", "threshold", "why"}`` from a measurement (``measure_engines``' result)."""
    a, b = measurement["baseline"], measurement["candidate"]
    dec = (measurement.get("protocol") or {}).get("decision") or {}
    out: dict[str, Any] = {"outcome": "failed", "faster": None, "slower": None, "ratio": None, "ci_low": None,
                           "ci_high": None, "n_pairs": measurement.get("n_pairs") or 0, "threshold": None}
    if measurement.get("verdict") == "failed" or not dec:
        out["why"] = f"the measurement failed: {measurement.get('error') or 'no look was reached'}"
        return out
    g = keep_threshold(dec.get("min_gain") or 0.0, dec.get("floor") or 0.0)
    r, lo, hi = float(dec["ratio"]), float(dec["ci_low"]), float(dec["ci_high"])
    how = "every pair's ratio (harm stop)" if dec.get("method") == "harm" else "interval"
    out.update(threshold=g, n_pairs=int(dec.get("n_pairs") or out["n_pairs"]))
    if measurement.get("verdict") == "keep":
        out.update(outcome="b_faster", faster=b, slower=a, ratio=r, ci_low=lo, ci_high=hi,
                   why=f"{b} over {a}: {ratio_x(r)} [{ratio_x(lo)}, {ratio_x(hi)}]: the {how}'s lower end is above "
                       f"the keep threshold {ratio_x(g)} (min_gain and the A/A floor)")
    elif hi < 1.0 / g:
        out.update(outcome="a_faster", faster=a, slower=b, ratio=1.0 / r, ci_low=1.0 / hi, ci_high=1.0 / lo,
                   why=f"{a} over {b}: {ratio_x(1.0 / r)} [{ratio_x(1.0 / hi)}, {ratio_x(1.0 / lo)}]: the {how}'s "
                       f"upper end of {b}/{a} ({ratio_x(hi)}) is below 1/{ratio_x(g)}, the keep rule read from the "
                       "other side")
    else:
        out.update(outcome="no_difference", ratio=r, ci_low=lo, ci_high=hi,
                   why=f"{b} over {a}: {ratio_x(r)} [{ratio_x(lo)}, {ratio_x(hi)}] ({measurement.get('verdict')}): "
                       f"the {how} clears neither {ratio_x(g)} nor 1/{ratio_x(g)}, so neither engine is measured "
                       "faster by the keep threshold")
    return out


def _quality_words(q: Mapping[str, Any] | None) -> str:
    if not q:
        return "their outputs were not compared (the measurement did not finish)"
    if not q.get("evaluated"):
        return f"their outputs could not be compared ({q.get('why')})"
    if q.get("agree"):
        return f"their outputs agree within the quality contract ({q.get('reference')} as the reference)"
    return f"their outputs differ beyond the quality contract ({'; '.join(q.get('failed') or [])})"


def recommendation(decision: Mapping[str, Any], rows: Mapping[str, Mapping[str, Any]],
                   quality: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{"deploy": name or None, "headline", "reasons": [...]}``: ``rows`` maps each session's name to its
    side-by-side row (:meth:`inferloom.engine_choice.sessions.EngineSession.row`)."""
    q = _quality_words(quality)
    names = list(rows)
    reasons = [q]
    for n in names:
        r = rows[n]
        if r.get("quality_passed") is False:
            reasons.append(f"{n}'s final stack FAILED its own session's held-out quality contract "
                           f"({'; '.join(r.get('quality_failed') or [])})")
    prec = {n: rows[n].get("precision") for n in names}
    if len(set(prec.values())) > 1:
        reasons.append("they run at different precisions: " + "; ".join(f"{n}: {p}" for n, p in prec.items()))
    roof = {n: rows[n].get("roofline_final") for n in names}
    if all(v is not None for v in roof.values()):
        reasons.append("their final stacks reach " + "; ".join(f"{n}: {number(100 * v, '.1f')}%" for n, v in roof.items())
                       + " of the device's roofline ceiling (each session's own measurement)")
    o = decision["outcome"]
    if o in ("a_faster", "b_faster"):
        head = (f"Deploy {decision['faster']}: measured {ratio_x(decision['ratio'])} "
                f"[{ratio_x(decision['ci_low'])}, {ratio_x(decision['ci_high'])}] as fast as {decision['slower']} "
                f"over {decision['n_pairs']} interleaved pairs of the two final stacks")
        return {"deploy": decision["faster"], "headline": head, "reasons": reasons}
    if o == "no_difference":
        head = (f"No measured difference: {ratio_x(decision['ratio'])} [{ratio_x(decision['ci_low'])}, "
                f"{ratio_x(decision['ci_high'])}] over {decision['n_pairs']} pairs; either engine serves this "
                "workload as fast within that interval, so choose on what else distinguishes them (below)")
        return {"deploy": None, "headline": head, "reasons": reasons}
    return {"deploy": None, "headline": f"No choice: {decision['why']}", "reasons": reasons}
