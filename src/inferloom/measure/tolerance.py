"""Which tolerance a candidate is judged against.

The quality contract's default thresholds are near-exact: they pass only
rounding-level differences. A spec may declare a looser tolerance for
numerics-changing candidates (``quality.numerics``: reduced precision,
quantization): a candidate that changes one of its ``knobs`` from stock is
judged against those thresholds instead, and by the task gate when one is
declared. Every verdict records the tolerance used and why
(``details["tolerance"]``), and the report shows it beside a kept change.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from inferloom.measure.quality import QualityThresholds

__all__ = ["EXACT", "NUMERICS", "numerics_changes", "tolerance_for"]

EXACT = "exact"  # the default thresholds
NUMERICS = "numerics"  # quality.numerics' thresholds


def numerics_changes(stock: Mapping[str, Any], cand: Mapping[str, Any], watched: Iterable[str]) -> list[str]:
    """Pure: ``knob stock -> candidate`` for each watched knob the candidate changes from stock."""
    return [f"{k} {stock.get(k)!s} -> {cand[k]!s}" for k in watched if k in cand and cand[k] != stock.get(k)]


def tolerance_for(q: Any, stock: Mapping[str, Any], cand: Mapping[str, Any]) -> tuple[QualityThresholds, dict[str, Any]]:
    """The thresholds for candidate ``cand`` under the spec's quality section
    ``q``, and a record of which tolerance that is and why."""
    base = QualityThresholds.from_spec(q)
    changes = numerics_changes(stock, cand, q.numerics.knobs) if q.numerics is not None else []
    if not changes:
        why = "no quality.numerics declared" if q.numerics is None else "changes no numerics knob from stock"
        return base, {"name": EXACT, "why": why}
    th = QualityThresholds(min_top1_agreement=q.numerics.min_top1_agreement, max_mean_kl=q.numerics.max_mean_kl,
                           min_greedy_agreement=q.numerics.min_greedy_agreement, tie_margin=base.tie_margin)
    gate = "and the task gate" if q.task is not None else "without a task gate (none declared)"
    return th, {"name": NUMERICS, "why": f"{', '.join(changes)}: quality.numerics thresholds {gate}",
                "changes": changes}
