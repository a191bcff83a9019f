"""The session's keep rule, written once: every path that keeps a change asks
:func:`session_keep` (the trial's coordinator, the rule Critic, the
calibration benchmark); ``inferloom verify`` re-derives it with its own code.

A keep needs the protocol's keep (the interval's lower end clears the minimum
gain), a passed quality contract, and the interval's lower end clearing the
minimum gain **and** the session's A/A floor together:

    ci_low > (1 + min_gain) * (1 + floor)

``floor`` (:func:`aa_floor`) is how far stock measured against a second
instance of itself landed from 1, as a gain, when the A/A resolves it:
``exp(|m| + h / 2) - 1`` if ``|m| > 3/4 h``, else 0 (``m = log ratio_AA``,
``h`` the half width of the A/A's interval, log scale). An instance effect (one server/process instance a few percent faster or slower
for its whole life: an H200 A/A showed -6%) is systematic: it is in the data
of every later comparison, and no paired interval can see it. It adds to the
true gain, so the floor is added to the minimum gain (on the log scale), not
put beside it (``max(min_gain, floor)``, the rule before: a change just under
the minimum gain on a slower baseline instance was kept 10.65% of the time at
1% noise). The A/A's own noise adds to the trial's, hence the margin of half a
half-width (about 1.2 standard errors of ``m``); an A/A that can't tell its
deviation from noise (``|m|`` under 3/4 of its half width, about 1.8 standard
errors) sets no floor, so that noise alone does not cost the power a real gain
needs. Chosen by simulation against the plain ``|m|``, ``|m| + h`` and other
gates: docs/protocol.md. Pure; no I/O.

:func:`decide` is a trial's whole verdict as a function (the coordinator's
``execute_trial`` asks it): the evidence, the Critic's ruling and a last
guard's finding in, kept / outcome / lesson and the refusal to record out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from inferloom.measure.records import Evidence

__all__ = ["FLOOR_GATE", "FLOOR_MARGIN", "aa_floor", "keep_threshold", "clears_floor", "rollback_band", "session_keep",
           "MALFORMED_RULING", "KEEP_WITHOUT_EVIDENCE", "KeepVerdict", "decide"]

#: the A/A sets a floor only when ``|log ratio_AA|`` exceeds this fraction of its interval's half width
FLOOR_GATE = 0.75
#: the floor is ``|log ratio_AA|`` plus this fraction of the A/A interval's half width (its own noise)
FLOOR_MARGIN = 0.5


def _num(x: Any) -> float | None:
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0
    return float(x) if ok else None


def aa_floor(noise: Mapping[str, Any] | None) -> float:
    """The A/A floor as a relative gain from an A/A noise block (:func:`inferloom.measure.protocol.noise_floor`:
    ``ratio``, ``ci_low``, ``ci_high``): ``exp(|m| + FLOOR_MARGIN h) - 1`` when ``|m| > FLOOR_GATE h``, else
    0 (``m = log ratio``, ``h = log(ci_high / ci_low) / 2``; no usable interval: ``h = 0``). 0.0 without an
    A/A or a usable ratio."""
    nf = noise or {}
    r, lo, hi = _num(nf.get("ratio")), _num(nf.get("ci_low")), _num(nf.get("ci_high"))
    if r is None:
        return 0.0
    m = abs(math.log(r))
    h = max(0.0, math.log(hi / lo) / 2.0) if lo is not None and hi is not None else 0.0
    return math.expm1(m + FLOOR_MARGIN * h) if m > FLOOR_GATE * h else 0.0


def keep_threshold(min_gain: float, floor: float) -> float:
    """The ratio a kept interval's lower end must exceed: ``(1 + min_gain) * (1 + floor)``."""
    return (1.0 + float(min_gain)) * (1.0 + float(floor))


def rollback_band(decision: Mapping[str, Any], noise_floor: Mapping[str, Any] | None, *, min_gain: float,
                  floor: float) -> tuple[bool, list[float], float]:
    """A rollback drill's test, ``(within, band, tolerance)``: "back within the noise floor" means the rolled-back vs stock
    interval (``decision``'s ``ci_low`` / ``ci_high``) meets the band stock measured against itself (the A/A
    interval, ``noise_floor``), widened to at least the keep threshold (``min_gain`` and the ``floor`` together: a
    difference no keep could claim) either side of x1; False without an interval."""
    tol = keep_threshold(min_gain, floor) - 1.0
    nf = noise_floor or {}
    band = [min(float(nf.get("ci_low") or 1.0), 1 - tol), max(float(nf.get("ci_high") or 1.0), 1 + tol)]
    lo, hi = decision.get("ci_low"), decision.get("ci_high")
    return lo is not None and hi is not None and lo <= band[1] and hi >= band[0], band, tol


def clears_floor(ci_low: Any, *, min_gain: float, floor: float) -> bool:
    """Whether the interval's lower end clears the minimum gain and the A/A floor together
    (False for a missing or non-finite bound)."""
    if not isinstance(ci_low, (int, float)) or isinstance(ci_low, bool) or not math.isfinite(ci_low):
        return False
    return ci_low > keep_threshold(min_gain, floor)


def session_keep(*, protocol_verdict: Any, quality_passed: Any, ci_low: Any, min_gain: float, floor: float,
                 allow_unscored: bool = False) -> bool:
    """THE keep decision of a session: the protocol kept, quality passed (or, with ``allow_unscored``, was
    not scored: ``None``), and :func:`clears_floor`."""
    quality_ok = quality_passed is True or (allow_unscored and quality_passed is None)
    return protocol_verdict == "keep" and quality_ok and clears_floor(ci_low, min_gain=min_gain, floor=floor)


#: the refusals :func:`decide` names, and why (the ledger's REFUSAL ``why``)
MALFORMED_RULING = ("malformed_output", "critic must return decision keep|revert and a lesson")
KEEP_WITHOUT_EVIDENCE = ("critic_keep_without_evidence",
                         "the protocol, quality or noise floor did not support a keep")


@dataclass(frozen=True)
class KeepVerdict:
    """A trial's verdict: ``kept``; ``outcome`` (``keep``, ``revert``, ``inconclusive``, ``failed``,
    ``reject-quality``, ``below-noise-floor``, ``drift``, or the guard's rule); the ``lesson``; the
    Critic's refusal to record (``(rule, why)``: a malformed ruling, or a keep the evidence does not
    support), and the guard's ``(rule, why)`` that turned a keep into a revert."""

    kept: bool
    outcome: str
    lesson: str
    refusal: tuple[str, str] | None = None
    guarded: tuple[str, str] | None = None


def decide(evidence: Evidence, ruling: Any, *, min_ratio: float | None = None,
           guarded: tuple[str, str] | None = None) -> KeepVerdict:
    """The trial's verdict from ``evidence`` and the Critic's ``ruling`` (``{"decision": "keep" | "revert",
    "lesson": str}``; anything else is malformed: reverted, refused). A keep needs the Critic's keep and
    :func:`session_keep` (quality scored and passed), and, with ``min_ratio`` (a warm replay), the measured
    ratio reaching it (a protocol keep below it is ``drift``). ``guarded``: a last check's ``(rule, why)``
    on a keep (e.g. a gain larger than Amdahl's law allows): the keep becomes outcome ``rule``; the caller
    runs its check only on a keep of this function's, then asks again with its finding. Pure."""
    ok_shape = isinstance(ruling, Mapping) and ruling.get("decision") in ("keep", "revert")
    allowed = (session_keep(protocol_verdict=evidence.protocol_verdict, quality_passed=evidence.quality_passed,
                            ci_low=evidence.ci_low, min_gain=evidence.min_gain or 0.0, floor=evidence.noise_floor or 0.0)
               and (min_ratio is None or (evidence.ratio or 0.0) >= min_ratio))
    critic_keep = ok_shape and ruling["decision"] == "keep"
    refusal = None if ok_shape else MALFORMED_RULING
    if critic_keep and not allowed:
        refusal = KEEP_WITHOUT_EVIDENCE
    keep = bool(critic_keep and allowed)
    guarded = guarded if keep else None
    if guarded:
        keep = False
    outcome = guarded[0] if guarded else _outcome(evidence, keep)
    below = min_ratio is not None and (evidence.ratio or 0.0) < min_ratio
    if not keep and below and evidence.protocol_verdict == "keep":
        outcome = "drift"
    lesson = ruling.get("lesson") if ok_shape and isinstance(ruling.get("lesson"), str) else \
        f"{evidence.changes}: {outcome}"
    if guarded:
        lesson = f"{evidence.changes}: {guarded[1]}"
    return KeepVerdict(kept=keep, outcome=outcome, lesson=lesson, refusal=refusal, guarded=guarded)


def _outcome(ev: Evidence, keep: bool) -> str:
    if keep:
        return "keep"
    if ev.protocol_verdict == "failed":
        return "failed"
    if ev.protocol_verdict == "keep" and ev.quality_passed is False:
        return "reject-quality"
    if ev.protocol_verdict == "keep":
        return "below-noise-floor"
    return str(ev.protocol_verdict)
