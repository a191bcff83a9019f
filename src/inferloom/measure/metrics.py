"""Metrics: pure functions of raw :class:`~inferloom.workloads.base.RunRecord` s.

Contract:

* Every function here is pure: no I/O, no clocks, no randomness, no global
  state. The same records always give the same numbers.
* A throughput metric of a failed record (``success=False``) or of a record
  whose timed region is not positive (``wall_s <= 0``) raises ``ValueError``;
  a failure is never silently turned into a number.
* Ratios are always "B over A" (candidate over baseline) and log-ratios are
  natural logs, ``log(B / A)``, so a positive value means B is faster.

Nothing here decides keep / revert; only :mod:`inferloom.measure.protocol` does.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Iterable, Sequence

from inferloom.workloads.base import RunRecord

__all__ = [
    "median_objective",
    "Metric",
    "METRICS",
    "output_tokens_per_s",
    "total_tokens_per_s",
    "requests_per_s",
    "goodput",
    "get_metric",
    "log_ratio",
    "log_ratios",
    "summarize",
]

Metric = Callable[[RunRecord], float]


def _checked_wall(rec: RunRecord) -> float:
    if not rec.success:
        raise ValueError(
            f"run {rec.config_id!r} seed {rec.seed} failed ({rec.error or 'no error text'}); "
            "a failed run has no throughput"
        )
    wall = float(rec.wall_s)
    if not math.isfinite(wall) or wall <= 0.0:
        raise ValueError(
            f"run {rec.config_id!r} seed {rec.seed}: wall_s={rec.wall_s!r}, expected a positive time"
        )
    return wall


def output_tokens_per_s(rec: RunRecord) -> float:
    """Generated tokens per second of the timed region: ``output_tokens / wall_s``."""
    wall = _checked_wall(rec)
    return float(rec.output_tokens) / wall


def total_tokens_per_s(rec: RunRecord) -> float:
    """Prompt plus generated tokens per second: ``(input + output) / wall_s``."""
    wall = _checked_wall(rec)
    return float(rec.input_tokens + rec.output_tokens) / wall


def requests_per_s(rec: RunRecord) -> float:
    """Completed requests per second: ``num_requests / wall_s``."""
    wall = _checked_wall(rec)
    return float(rec.num_requests) / wall


def goodput(rec: RunRecord) -> float:
    """Requests per second meeting every declared SLO (``request_goodput`` of
    the load generator's result in ``extra['serving']``; server adapters only)."""
    _checked_wall(rec)
    serving = rec.extra.get("serving") or {}
    v = serving.get("request_goodput")
    if v is None:
        raise ValueError(f"run {rec.config_id!r} seed {rec.seed}: no request_goodput (no SLO declared, or not a server run)")
    return float(v)


METRICS: dict[str, Metric] = {
    "output_tokens_per_s": output_tokens_per_s,
    "goodput": goodput,
    "total_tokens_per_s": total_tokens_per_s,
    "requests_per_s": requests_per_s,
}


def get_metric(name: str) -> Metric:
    """The metric function named ``name`` (a spec ``objective``)."""
    try:
        return METRICS[name]
    except KeyError:
        raise ValueError(
            f"objective '{name}': unknown, expected one of " + ", ".join(sorted(METRICS))
        ) from None


def _value(x: Any, metric: Metric) -> float:
    if isinstance(x, RunRecord):
        return metric(x)
    v = float(x)
    return v


def log_ratio(a: float | RunRecord, b: float | RunRecord, metric: Metric = output_tokens_per_s) -> float:
    """``log(B / A)`` of two positive values (or two records, through ``metric``)."""
    va, vb = _value(a, metric), _value(b, metric)
    if not (math.isfinite(va) and math.isfinite(vb)) or va <= 0.0 or vb <= 0.0:
        raise ValueError(f"log ratio needs two positive finite values, got A={va!r}, B={vb!r}")
    return math.log(vb / va)


def log_ratios(
    pairs: Iterable[tuple[float | RunRecord, float | RunRecord]],
    metric: Metric = output_tokens_per_s,
) -> list[float]:
    """``log(B / A)`` of each ``(A, B)`` pair; items may be values or records."""
    return [log_ratio(a, b, metric) for a, b in pairs]


def summarize(values: Sequence[float]) -> dict[str, float | int]:
    """``n``, ``median``, ``mean``, ``sd`` (sample, 0 for n=1), ``min``, ``max``.

    An empty sequence raises ``ValueError``.
    """
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("summarize: no values")
    return {
        "n": len(vals),
        "median": statistics.median(vals),
        "mean": statistics.fmean(vals),
        "sd": statistics.stdev(vals) if len(vals) > 1 else 0.0,
        "min": min(vals),
        "max": max(vals),
    }


def median_objective(measurement: Any, *arms: str) -> float:
    """Median objective over the pairs of a measurement record (``value_a``
    for the base arm, ``value_b`` for the candidate), over the given arms."""
    return statistics.median(p[a] for p in measurement["protocol"]["pairs"] for a in arms)
