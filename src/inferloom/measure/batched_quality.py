"""The batched guard: a server's batched paths, judged for gross damage only.

The contract's probes send each prompt alone (``quality.concurrency`` 1), so
every server computes the same batch shapes and the comparison sees only a
knob's arithmetic. But then a knob that breaks only batched computation (a
wrong attention backend for several sequences, a broken CUDA graph of a larger
batch) would pass unseen. So an adapter with the ``BatchedProbes`` hook also
runs the same prompts all in one request, and that run is judged against the
stock reference with the loosest thresholds any floor may reach
(:data:`~inferloom.measure.quality_floor.HARD_LIMITS`: top-1 0.85, KL 0.25
nats, greedy 0.4). Which batches form in one request depends on timing: on an
H200 that noise measured top-1 0.961-0.973 (an fp8 A/A; ``async_scheduling``),
KL 0.05, greedy 0.875, rounding-level and well inside the limits; a broken
computation lands near top-1 0 and KL of nats (tests/test_quality_floor.py).

The values are kept in each verdict's ``details["batched"]``: in PRELUDE's A/A
they are the server's own batch-composition noise, measured where it arises.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from inferloom.measure import image_quality as IQ
from inferloom.measure import quality as Q
from inferloom.measure.quality_floor import HARD_LIMITS
from inferloom.workloads.base import BatchedProbes

__all__ = ["LIMITS", "batched_guard"]

#: check -> (op, limit): the loosest thresholds a floor may reach, for gross damage only
LIMITS: dict[str, tuple[str, float]] = {
    "top1_agreement": (">=", HARD_LIMITS["min_top1_agreement"]),
    "mean_kl": ("<=", HARD_LIMITS["max_mean_kl"]),
    "greedy_agreement": (">=", HARD_LIMITS["min_greedy_agreement"]),
}


def judge_batched(values: dict[str, float]) -> tuple[str | None, str | None]:
    """Pure: ``(failed check, message)`` of the first check past its limit; ``(None, None)`` when none is."""
    for name, (op, limit) in LIMITS.items():
        v = values[name]
        ok = v >= limit if op == ">=" else v <= limit
        if not ok:
            return f"batched_{name}", (f"batched {name} = {v:.4g}, required {op} {limit:g} (all prompts in one "
                                       "request; judged for gross damage only)")
    return None, None


def batched_guard(adapter: Any, handle: Any, ref: Q.Reference, verdict: Q.QualityVerdict,
                  margin: "float | Callable[[], float]") -> Q.QualityVerdict:
    """Run the batched probes on ``handle`` against ``ref`` and fold the result into ``verdict``:
    ``details["batched"]`` always; a failed check fails a verdict that passed. No hook: unchanged."""
    if not isinstance(adapter, BatchedProbes) or isinstance(ref, IQ.ImageReference):
        return verdict
    margin = margin() if callable(margin) else margin  # after the check: an image reference has no tie margin
    t0 = time.perf_counter()
    lp = adapter.score_batched(handle, ref.prompts, ref.continuations)
    conts = adapter.greedy_batched(handle, ref.prompts, len(ref.continuations[0]))
    values = {**Q.teacher_forced_agreement(ref.logprobs, lp, margin),
              **Q.greedy_agreement(ref.continuations, conts, ref.logprobs, margin)}
    failed, msg = judge_batched(values)
    verdict.details["batched"] = {"values": values, "limits": {k: list(v) for k, v in LIMITS.items()},
                                  "passed": failed is None, "seconds": time.perf_counter() - t0}
    if failed and verdict.passed:
        verdict.passed, verdict.failed_check, verdict.message = False, failed, f"{ref.set_name}: {msg}"
    return verdict
