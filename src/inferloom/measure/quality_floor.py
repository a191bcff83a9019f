"""The quality floor of a server: its own A/A disagreement.

Two identical vLLM servers do not produce identical outputs (batch-dependent
kernels; prompt log-probabilities computed inside a batch). Measured on one
H200 on 2026-11-30 (../shared/FACTS.md): two identical fp8 servers agreed on
the held-out set at top-1 0.9609 (< 0.98), KL 0.0495, greedy 0.875, so a fixed
threshold against stock rejects a server against itself. As the tie margin is
for the in-process engine, the server's own A/A disagreement is the floor:

**Rule.** Measure stock against a second stock instance (PRELUDE's A/A) with
the quality contract, per prompt set: ``aa``. A candidate's disagreement with
stock may exceed the A/A's by at most the declared allowance:

* ``top1_agreement >= aa.top1_agreement - (1 - min_top1_agreement)``
* ``mean_kl <= aa.mean_kl + max_mean_kl``
* ``greedy_agreement >= aa.greedy_agreement - (1 - min_greedy_agreement)``

With a perfect A/A (1, 0, 1) these are the declared thresholds exactly; the
floor only ever relaxes them, by what the server measured against itself.
The declared allowance is the contract's own thresholds, or, for a candidate
that changes numerics (fp8 weights, fp8 KV cache, dtype), the spec's
``quality.numerics`` tolerance where it declares one
(:func:`inferloom.measure.tolerance.tolerance_for`; else the contract's own:
fail-closed).

**Guard rails** (so a broken A/A cannot open the gate): a threshold is never
relaxed past :data:`HARD_LIMITS` (top-1 0.85, KL 0.25 nats, greedy 0.4),
whatever the floor says; a floor value that is not finite or out of range is
ignored for that check. Broken output lands far outside: a random-weights
preset's wrong computation gives top-1 agreement near 0 and a KL of nats
(tests/test_quality_floor.py measures it).

Every function here is pure; the phases hand the A/A's values in.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from inferloom.measure.quality import QualityThresholds
from inferloom.measure.tolerance import tolerance_for

__all__ = ["FLOOR_CHECKS", "HARD_LIMITS", "apply_floor", "candidate_thresholds", "floor_from_quality"]

#: the checks the floor adjusts: name -> (threshold field, higher_is_better)
FLOOR_CHECKS: Mapping[str, tuple[str, bool]] = {
    "top1_agreement": ("min_top1_agreement", True),
    "mean_kl": ("max_mean_kl", False),
    "greedy_agreement": ("min_greedy_agreement", True),
}
#: the loosest each threshold may become through a floor, whatever the A/A measured
HARD_LIMITS: Mapping[str, float] = {"min_top1_agreement": 0.85, "max_mean_kl": 0.25, "min_greedy_agreement": 0.4}


def _usable(name: str, v: Any) -> bool:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        return False
    return v >= 0 if name == "mean_kl" else 0.0 <= v <= 1.0


def apply_floor(th: QualityThresholds, floor: Mapping[str, Any] | None) -> tuple[QualityThresholds, dict[str, Any]]:
    """``(thresholds, info)``: ``th`` relaxed by the A/A ``floor`` (its
    ``top1_agreement``, ``mean_kl``, ``greedy_agreement``) by the rule of the
    module docstring, never past :data:`HARD_LIMITS`. ``info`` records the
    declared and used thresholds, the floor, and each check that hit a limit."""
    info: dict[str, Any] = {"rule": "candidate disagreement <= A/A disagreement + declared allowance",
                            "floor": None, "declared": {}, "used": {}, "capped": [], "ignored": []}
    for _check, (field, _hi) in FLOOR_CHECKS.items():
        info["declared"][field] = getattr(th, field)
    if not floor:
        info["used"] = dict(info["declared"])
        return th, info
    info["floor"] = {c: floor.get(c) for c in FLOOR_CHECKS}
    new: dict[str, float] = {}
    for check, (field, higher) in FLOOR_CHECKS.items():
        declared = float(getattr(th, field))
        v = floor.get(check)
        if not _usable(check, v):
            info["ignored"].append(check)
            new[field] = declared
            continue
        if higher:
            val = min(declared, float(v) - (1.0 - declared))
            if val < HARD_LIMITS[field]:
                val = min(declared, HARD_LIMITS[field])
                info["capped"].append(check)
        else:
            val = max(declared, declared + float(v))
            if val > HARD_LIMITS[field]:
                val = max(declared, HARD_LIMITS[field])
                info["capped"].append(check)
        new[field] = max(0.0, val)
    out = dataclasses.replace(th, **new)
    info["used"] = {f: getattr(out, f) for f in info["declared"]}
    return out, info


def candidate_thresholds(quality: Any, floor: Mapping[str, Any] | None, stock: Mapping[str, Any],
                         cand: Mapping[str, Any]) -> tuple[QualityThresholds, dict[str, Any]]:
    """The thresholds a candidate is judged with on one prompt set: the
    tolerance declared for it (:func:`~inferloom.measure.tolerance.tolerance_for`:
    the contract's, or ``quality.numerics`` for a numerics change) relaxed by
    that set's A/A ``floor`` (:func:`apply_floor`); ``info`` says which and why."""
    th, tolerance = tolerance_for(quality, stock, cand)
    th, info = apply_floor(th, floor)
    info["tolerance"] = tolerance["name"]
    info["tolerance_why"] = tolerance["why"]
    return th, info


def floor_from_quality(q: Mapping[str, Any] | None) -> dict[str, dict[str, float]]:
    """Per prompt set, the A/A's measured values (``compare``'s quality record
    of stock-2 judged against stock's reference); empty when none was measured."""
    if not q or not q.get("evaluated"):
        return {}
    out: dict[str, dict[str, float]] = {}
    for s in q.get("sets") or []:
        vals = s.get("values") or {}
        picked = {c: float(vals[c]) for c in FLOOR_CHECKS if _usable(c, vals.get(c))}
        if s.get("set_name") and picked:
            out[str(s["set_name"])] = picked
    return out
