"""Microbenchmark of an entry against the op it replaces, and its autotune.

On CUDA: CUDA events around each call, warm-up excluded, median of ``runs``;
inputs rotate over enough independent sets that together they exceed
``l2_factor`` times the L2 cache, so no call finds its operands in L2 from the
previous one. Before each timed call the GPU is kept busy (``torch.cuda._sleep``)
while the host enqueues the events and the kernels, so launch overhead on the
host is not counted: the number is GPU time, which is what a CUDA-graph replay
of the decode step pays. Off CUDA (the interpreter smoke path) it falls back
to wall time with ``time.perf_counter`` and is meaningless as a speed.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Mapping

import torch

from inferloom.kernels.catalog import tuning
from inferloom.kernels.catalog.entry import CatalogEntry, _errors, as_tuple, poison
from inferloom.kernels.gates import time_call

__all__ = ["input_sets", "time_calls", "bench_entry", "autotune_entry", "l2_bytes"]

_MAX_ROTATION_BYTES = 8 << 30


def l2_bytes(device: str) -> int:
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 50 << 20) or (50 << 20))
    return 0


def _nbytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, Mapping):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(_nbytes(v) for v in obj)
    return 0


def input_sets(entry: CatalogEntry, shape: Mapping[str, int], dtype: str, device: str, seed: int,
               l2_factor: float = 3.0, min_sets: int = 2, max_sets: int = 256) -> list[tuple[dict, Any]]:
    """Independent ``(inputs, out)`` sets whose total size exceeds ``l2_factor`` × L2."""
    first = entry.make_inputs(shape, dtype, device, seed)
    per = max(1, _nbytes(first))
    want = math.ceil(l2_factor * l2_bytes(device) / per) if l2_bytes(device) else min_sets
    n = max(min_sets, min(max_sets, want, max(1, _MAX_ROTATION_BYTES // per)))
    return [first] + [entry.make_inputs(shape, dtype, device, seed + i) for i in range(1, n)]


def time_calls(calls: list[Callable[[], Any]], device: str, runs: int = 50, warmup: int = 5) -> list[float]:
    """Microseconds per call, one entry per run; run ``i`` uses ``calls[i % len(calls)]``
    (timed like the KERNEL phase's microbenchmark gate: :func:`inferloom.kernels.gates.time_call`)."""
    n = len(calls)
    for i in range(warmup):
        calls[i % n]()
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    return [time_call(calls[(warmup + i) % n], cuda) * 1e6 for i in range(runs)]


def bench_entry(entry: CatalogEntry, shape: Mapping[str, int], dtype: str, device: str, seed: int = 1000,
                runs: int = 50, warmup: int = 5, config: Mapping[str, Any] | None = None,
                sets: list[tuple[dict, Any]] | None = None) -> dict[str, Any]:
    """Median µs of the implementation and of the baseline on the same rotating inputs."""
    sets = sets if sets is not None else input_sets(entry, _bench_shape(shape), dtype, device, seed)
    kw = {"config": config} if config is not None else {}
    impl = [lambda i=i, o=o: entry.implementation(**i, out=o, **kw) for i, o in sets]
    base = [lambda i=i: entry.baseline(**i) for i, _ in sets]
    t_impl = time_calls(impl, device, runs, warmup)
    t_base = time_calls(base, device, runs, warmup)
    m_impl, m_base = statistics.median(t_impl), statistics.median(t_base)
    return {"impl_us": m_impl, "baseline_us": m_base, "speedup": m_base / m_impl if m_impl > 0 else math.nan,
            "impl_p10_p90": _p10_p90(t_impl), "baseline_p10_p90": _p10_p90(t_base),
            "runs": runs, "input_sets": len(sets), "rotating_mb": round(_nbytes(sets) / 2**20, 1)}


def _bench_shape(shape: Mapping[str, int]) -> dict[str, int]:
    s = dict(shape)
    if "max_len" in s:
        s["poison_tail"] = 0  # the baseline reads the padding (masked): NaN there would poison it
    return s


def _p10_p90(xs: list[float]) -> list[float]:
    ys = sorted(xs)
    return [ys[int(0.1 * (len(ys) - 1))], ys[int(0.9 * (len(ys) - 1))]]


def autotune_entry(entry: CatalogEntry, shape: Mapping[str, int], dtype: str,
                   device: str, seed: int = 2000, runs: int = 30) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Time each config of the entry's tune space (after a correctness check on
    one poisoned run) and cache the winner under ``entry.tune_key(shape)`` (the
    shape the implementation looks itself up by)."""
    check_in, check_out = entry.make_inputs(shape, dtype, device, seed)
    ref = as_tuple(entry.reference(**check_in))
    tol = entry.tolerance(dtype)
    sets = input_sets(entry, _bench_shape(shape), dtype, device, seed + 1)

    def is_correct(cfg):
        poison(check_out)
        entry.implementation(**check_in, out=check_out, config=cfg)
        for g, r in zip(as_tuple(check_out), ref):
            if not bool(torch.isfinite(g.float()).all()):
                return False
            l2, mx = _errors(g, r)
            if not (l2 <= tol["rel_l2"] and mx <= tol["max_rel"]):
                return False
        return True

    def time_config(cfg):
        calls = [lambda i=i, o=o: entry.implementation(**i, out=o, config=cfg) for i, o in sets]
        return statistics.median(time_calls(calls, device, runs, 3))

    return tuning.autotune(entry, entry.tune_key(shape), dtype, device, time_config, is_correct)
