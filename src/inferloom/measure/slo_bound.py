"""Did a goodput measurement's SLOs bind?

Goodput counts the requests that met every declared SLO per second. When every
request of every timed run met them, goodput is just the completed rate, and
under Poisson arrivals that rate is set by the arrival draws (the same seed in
both arms of a pair), not by the server: such an operating point cannot tell two
configurations apart by goodput, however fast one of them is. Measured on one
H200 (docs/benchmarks.md §13, run 3): 45 req/s with 500 ms TTFT / 50 ms TPOT
SLOs, 2,400 of 2,400 requests good, p99 TPOT at most 10.3 ms.

:func:`slo_binding` reads the per-run serving summaries a compare recorded
(``RunRecord.extra["serving"]``, :func:`inferloom.loadgen.metrics.summarize`)
and says how many requests missed an SLO, the worst p99 latencies against the
SLOs, and, when none missed, what to change.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

__all__ = ["slo_binding"]

_P99 = {"ttft_ms": "p99_ttft_ms", "tpot_ms": "p99_tpot_ms", "e2el_ms": "p99_e2el_ms"}


def _servings(pairs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    out = []
    for p in pairs:
        for arm in ("a", "b"):
            s = ((p.get(arm) or {}).get("extra") or {}).get("serving")
            if isinstance(s, Mapping) and s.get("goodput_slo_ms") and s.get("good_requests") is not None:
                out.append(s)
    return out


def slo_binding(pairs: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """How much the SLOs bound over the timed runs of ``pairs`` (a protocol's
    ``pairs`` list); None when no run recorded a goodput SLO."""
    servings = _servings(pairs)
    if not servings:
        return None
    slo = dict(servings[0]["goodput_slo_ms"])
    completed = sum(int(s.get("completed") or 0) for s in servings)
    missed = sum(int(s.get("completed") or 0) - int(s["good_requests"]) for s in servings)
    worst = {}
    for key, field in _P99.items():
        vals = [s[field] for s in servings if s.get(field) is not None]
        if key in slo and vals:
            worst[f"max_{field}"] = max(vals)
    out: dict[str, Any] = {"runs": len(servings), "completed": completed, "missed_slo": missed,
                           "missed_fraction": missed / completed if completed else None, "slo_ms": slo,
                           **worst, "binding": missed > 0}
    if missed == 0 and completed:
        margins = ", ".join(f"worst p99 {k.removesuffix('_ms').upper()} {worst['max_' + _P99[k]]:.1f} ms of {v:g} ms"
                            for k, v in slo.items() if "max_" + _P99[k] in worst)
        out["note"] = (f"the SLOs never bound: all {completed} requests of {len(servings)} timed runs met them"
                       f" ({margins}), so goodput here is the completed rate, which the arrival process sets;"
                       " it cannot tell configurations apart. Raise serving.request_rate towards saturation or"
                       " tighten the SLOs")
    return out
