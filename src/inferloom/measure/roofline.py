"""Roofline and Amdahl: how far a workload sits from what the device can do.

:func:`roofline` turns the device's ceilings (:mod:`inferloom.measure.ceilings`)
and the cost model's bytes and FLOPs (:mod:`inferloom.measure.costs`) plus a
measured throughput into time floors, the achievable output tok/s, the
achieved fraction and the headroom; :func:`amdahl_limit` is Amdahl's law and
:func:`amdahl_check` flags a measured gain larger than the roofline or
Amdahl's law allows. Each returns a JSON-able dict (or a number).

Floors: a phase cannot take less than ``max(bytes / bandwidth, FLOPs / matmul
rate)`` (the roofline). The run floor is ``prefill_floor + (n-1) *
decode_step_floor``; the achievable ceiling is ``b * n / run_floor`` output
tok/s. Against FACTS.md (Llama-3.1-8B shape, bf16, batch 64, 256 in / 128 out,
4.11 TB/s): decode-step floor 4.38 ms (FACTS: 4.6 ms, which counts the whole
16.06 GB of weights, embedding table included; a step does not read the table)
and decode-only ceiling 15.3k tok/s at 4.3 TB/s (FACTS: 14,681).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from inferloom.measure.costs import (
    SHAPE_KEYS,
    decode_step_costs,
    derived_counts,
    mean_decode_context,
    prefill_costs,
)

__all__ = ["roofline", "amdahl_limit", "amdahl_check"]


def _floors(phase: Mapping[str, Any], bw: float, peak: float) -> dict[str, Any]:
    t_bw = phase["bytes"] / bw
    t_cmp = phase["flops"] / peak
    return {
        "bandwidth_s": t_bw,
        "compute_s": t_cmp,
        "floor_s": max(t_bw, t_cmp),
        "bound": "memory" if t_bw >= t_cmp else "compute",
    }


def roofline(
    ceilings: Mapping[str, Any],
    costs: Mapping[str, Any],
    measured_tok_per_s: float | None,
    batch: int,
    output_len: int,
    input_len: int,
    *,
    tolerance: float = 0.02,
) -> dict[str, Any]:
    """Time floors of one ``generate()`` of ``batch`` sequences (``input_len``
    in, ``output_len`` out), the achievable output tok/s and where
    ``measured_tok_per_s`` sits against it.

    ``ceilings``: :func:`measure_ceilings`'s dict (or any mapping with
    ``memory_bandwidth_bytes_per_s`` and ``matmul_flops_per_s``). ``costs``:
    :func:`step_costs`'s dict; its model shape and dtypes are used, the batch
    and lengths come from the arguments (decode at the mean context
    ``input_len + output_len/2``).

    Returns per phase the bandwidth-bound, compute-bound and roofline floors;
    per run ``bandwidth_floor_s`` (all bytes / bandwidth), ``compute_floor_s``
    (all FLOPs / matmul rate) and ``floor_s`` (sum of per-phase maxima);
    ``ceiling_tok_per_s`` (``batch*output_len / floor_s``, prefill included,
    like the measured metric), ``decode_only_ceiling_tok_per_s``
    (``batch / decode_step_floor``); ``fraction`` (measured / ceiling),
    ``decode_only_fraction``, ``headroom`` (ceiling / measured: how many times
    faster the floor allows) and ``suspect`` (fraction above ``1 + tolerance``:
    faster than the hardware allows, so the measurement or the cost model is
    wrong, e.g. speculative decoding, which emits several tokens per weight
    read and so is not bound by this per-token floor).
    """
    bw = float(ceilings["memory_bandwidth_bytes_per_s"])
    peak = float(ceilings["matmul_flops_per_s"])
    if not (bw > 0 and peak > 0 and math.isfinite(bw) and math.isfinite(peak)):
        raise ValueError("roofline: ceilings must be positive and finite")
    if batch < 1 or output_len < 1 or input_len < 1:
        raise ValueError("roofline: batch, output_len and input_len must be >= 1")
    m = costs["model"]
    shape = {k: m[k] for k in SHAPE_KEYS}
    B, Bkv = float(costs["dtype_bytes"]), float(costs["kv_dtype_bytes"])
    der = derived_counts(shape, B, Bkv)
    ctx = mean_decode_context(input_len, output_len)
    dec = decode_step_costs(shape, der, batch, ctx, B)
    pre = prefill_costs(shape, der, batch, input_len, B)
    f_dec, f_pre = _floors(dec, bw, peak), _floors(pre, bw, peak)
    steps = output_len - 1
    floor_s = f_pre["floor_s"] + steps * f_dec["floor_s"]
    bw_floor = f_pre["bandwidth_s"] + steps * f_dec["bandwidth_s"]
    cmp_floor = f_pre["compute_s"] + steps * f_dec["compute_s"]
    ceiling = batch * output_len / floor_s
    dec_ceiling = batch / f_dec["floor_s"]
    out: dict[str, Any] = {
        "ceilings": {
            "memory_bandwidth_bytes_per_s": bw,
            "matmul_flops_per_s": peak,
            "date": ceilings.get("date"),
            "device_name": ceilings.get("device_name"),
        },
        "batch": int(batch),
        "input_len": int(input_len),
        "output_len": int(output_len),
        "decode_steps": steps,
        "mean_decode_context": ctx,
        "decode_step": {**f_dec, "bytes": dec["bytes"], "flops": dec["flops"]},
        "prefill": {**f_pre, "bytes": pre["bytes"], "flops": pre["flops"]},
        "bandwidth_floor_s": bw_floor,
        "compute_floor_s": cmp_floor,
        "floor_s": floor_s,
        "ceiling_tok_per_s": ceiling,
        "decode_only_ceiling_tok_per_s": dec_ceiling,
        "measured_tok_per_s": None,
        "fraction": None,
        "decode_only_fraction": None,
        "headroom": None,
        "suspect": False,
        "tolerance": tolerance,
    }
    if measured_tok_per_s is not None:
        meas = float(measured_tok_per_s)
        if not (meas > 0 and math.isfinite(meas)):
            raise ValueError(f"roofline: measured_tok_per_s={measured_tok_per_s!r}, expected a positive number")
        frac = meas / ceiling
        out.update(
            measured_tok_per_s=meas,
            fraction=frac,
            decode_only_fraction=meas / dec_ceiling,
            headroom=ceiling / meas,
            suspect=frac > 1.0 + tolerance,
        )
        if out["suspect"]:
            out["reason"] = (
                f"measured {meas:.4g} tok/s is {frac:.2f}x the roofline ceiling {ceiling:.4g} tok/s"
            )
    return out


# ------------------------------------------------------------------ Amdahl
def amdahl_limit(fraction_affected: float, local_speedup: float = math.inf) -> float:
    """Amdahl's law: the whole-run speedup when a part taking
    ``fraction_affected`` of the time gets ``local_speedup`` times faster:
    ``1 / ((1 - p) + p / s)`` (``s`` infinite: ``1 / (1 - p)``)."""
    p = float(fraction_affected)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"amdahl_limit: fraction_affected={p}, expected [0, 1]")
    s = float(local_speedup)
    if s <= 0:
        raise ValueError(f"amdahl_limit: local_speedup={s}, expected > 0")
    rest = (1.0 - p) + (0.0 if math.isinf(s) else p / s)
    return math.inf if rest <= 0 else 1.0 / rest


def amdahl_check(measured_gain: float, max_possible_gain: float | None, *, tolerance: float = 0.05) -> dict[str, Any]:
    """Flag a measured gain the roofline or Amdahl's law says is impossible.

    Gains are speedup ratios (candidate tok/s over baseline tok/s; 1.25 is
    +25%). ``max_possible_gain``: the largest gain allowed, e.g. the stock
    roofline ``headroom`` or :func:`amdahl_limit` of the profiled share a
    change touches (None or inf: no limit known). ``suspect`` when
    ``measured_gain > max_possible_gain * (1 + tolerance)`` (the tolerance
    absorbs measurement noise and the cost model's approximations).
    """
    g = float(measured_gain)
    if not (g > 0 and math.isfinite(g)):
        raise ValueError(f"amdahl_check: measured_gain={measured_gain!r}, expected a positive ratio")
    limit = None if max_possible_gain is None else float(max_possible_gain)
    if limit is not None and not limit > 0:
        raise ValueError(f"amdahl_check: max_possible_gain={max_possible_gain!r}, expected > 0")
    known = limit is not None and math.isfinite(limit)
    suspect = bool(known and g > limit * (1.0 + tolerance))
    out: dict[str, Any] = {
        "measured_gain": g,
        "max_possible_gain": limit if known else None,
        "tolerance": tolerance,
        "margin": (g / limit) if known else None,
        "suspect": suspect,
        "verdict": "suspect" if suspect else ("ok" if known else "unbounded"),
    }
    if suspect:
        out["reason"] = f"measured gain {g:.3f}x exceeds the {limit:.3f}x the roofline / Amdahl's law allows"
    return out
