"""The gates a kernel candidate passes before the coordinator measures it
end to end, each refusing with a named rule.

1. :func:`correctness` (rules ``kernel_crashed``, ``kernel_nan_or_unwritten``,
   ``kernel_incorrect``): at every one of the candidate's shapes (the
   workload's real ones) and several seeds, on fresh random inputs each time,
   every output buffer (a pair for ``add_rmsnorm``) is poisoned with NaN
   before the kernel runs, so an element it does not write fails; NaN or Inf
   never passes; the error (of each output; the worst counts)
   against the higher-precision reference (relative L2 norm, and the largest
   element error relative to the reference's largest magnitude) must be
   within the candidate's declared tolerance.
2. :func:`microbenchmark` (rules ``kernel_crashed``, ``kernel_not_faster``):
   kernel against the op it replaces, the two interleaved call by call,
   warm-up excluded, the median of many timed calls (on a GPU, CUDA events
   around each call with the host's launch overhead hidden, see
   :func:`time_call`; the host clock on a CPU; a candidate's ``timed`` call, where it has one, instead of
   its ``implementation`` writing ``out``), rotating over enough input sets that together
   they exceed the L2 cache, so a cache can't flatter either side. The candidate must beat the op by
   ``min_speedup``.

Neither gate keeps anything: only the paired end-to-end measurement does.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from inferloom.kernels.base import KernelCandidate
from inferloom.spec import KernelSpec, field_default

__all__ = ["GateResult", "correctness", "error_metrics", "microbenchmark", "cache_bytes", "crash_text", "MIN_SPEEDUP"]

MIN_SPEEDUP: float = field_default(KernelSpec, "min_speedup")  # the spec declares it: kernels.min_speedup
_CORRECTNESS_SEEDS = (11, 12, 13)



def crash_text(exc: BaseException, limit: int = 300) -> str:
    """What a crashed kernel raised, at most about ``limit`` characters: its start and its end when longer (Triton's
    ``CompilationError`` opens with the kernel's source and names the cause last, e.g. ``Expected dtype ['fp32',
    'fp64'] but got bf16`` of ``tl.exp`` on a bf16 value, which only compiling for the GPU raises)."""
    msg = str(exc)
    if len(msg) <= limit:
        return msg
    head = max(limit // 3, 1)
    return f"{msg[:head]} ... {msg[-(limit - head):]}"

@dataclass
class GateResult:
    gate: str
    passed: bool
    rule: str | None = None
    why: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def error_metrics(out: Any, ref: Any) -> dict[str, float]:
    """``rel_l2`` = ||out - ref|| / ||ref|| and ``max_rel`` = max|out - ref| / max|ref|, in float64."""
    import torch

    o, r = out.detach().to(torch.float64), ref.detach().to(torch.float64)
    diff = o - r
    ref_norm = float(torch.linalg.vector_norm(r))
    ref_max = float(r.abs().max()) if r.numel() else 0.0
    tiny = 1e-30
    return {"rel_l2": float(torch.linalg.vector_norm(diff)) / max(ref_norm, tiny),
            "max_rel": (float(diff.abs().max()) if diff.numel() else 0.0) / max(ref_max, tiny)}


def correctness(cand: KernelCandidate, device: str, seeds: tuple[int, ...] = _CORRECTNESS_SEEDS) -> GateResult:
    """Gate 1 (see the module docstring)."""
    import torch

    checks = []
    for shape in cand.shapes:
        for seed in seeds:
            where = f"shape {dict(shape)}, seed {seed}"
            try:
                inputs, out = cand.make_inputs(shape, cand.dtype, device, seed)
                outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)  # add_rmsnorm writes a pair
                for o in outs:
                    o.fill_(float("nan"))
                cand.implementation(**inputs, out=out)
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                ref = cand.reference(**inputs)
                refs = tuple(ref) if isinstance(ref, (tuple, list)) else (ref,)
            except Exception as exc:  # noqa: BLE001 - a crash is a refusal, never the session's end
                return GateResult("correctness", False, "kernel_crashed",
                                  f"{cand.id} raised {type(exc).__name__} at {where}: {crash_text(exc)}",
                                  {"checks": checks})
            errs = []
            for i, (o, r) in enumerate(zip(outs, refs)):
                name = f"output {i} " if len(outs) > 1 else "output "
                if tuple(o.shape) != tuple(r.shape):
                    return GateResult("correctness", False, "kernel_incorrect",
                                      f"{cand.id}: {name}shape {tuple(o.shape)} != reference {tuple(r.shape)} at "
                                      f"{where}", {"checks": checks})
                bad = int((~torch.isfinite(o)).sum())
                if bad:
                    return GateResult("correctness", False, "kernel_nan_or_unwritten",
                                      f"{cand.id}: {bad} of {o.numel()} {name}elements are NaN/Inf (unwritten or "
                                      f"non-finite) at {where}", {"checks": checks})
                errs.append(error_metrics(o, r))
            err = {k: max(e[k] for e in errs) for k in ("rel_l2", "max_rel")}
            checks.append({"shape": dict(shape), "seed": seed, **err})
            over = {k: v for k, v in err.items() if v > float(cand.tolerance.get(k, math.inf))}
            if over:
                return GateResult("correctness", False, "kernel_incorrect",
                                  f"{cand.id}: error {', '.join(f'{k}={v:.3g}' for k, v in over.items())} over the "
                                  f"declared tolerance {dict(cand.tolerance)} at {where}", {"checks": checks})
    worst = {k: max(c[k] for c in checks) for k in ("rel_l2", "max_rel")} if checks else {}
    return GateResult("correctness", True, None,
                      f"{cand.id}: {len(checks)} checks within tolerance (worst rel_l2 {worst.get('rel_l2', 0):.2e}, "
                      f"max_rel {worst.get('max_rel', 0):.2e})", {"checks": checks, "worst": worst})


def cache_bytes(device: str) -> int:
    """Size of the L2 cache the rotation must exceed (bytes): the GPU's L2, or
    this CPU core's L2 (sysfs; 2 MiB when unreadable)."""
    if device.startswith("cuda"):
        import torch

        return int(getattr(torch.cuda.get_device_properties(torch.device(device)), "L2_cache_size", 50 << 20))
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for idx in sorted(os.listdir(base)):
            try:
                with open(os.path.join(base, idx, "level")) as f:
                    if f.read().strip() != "2":
                        continue
                with open(os.path.join(base, idx, "size")) as f:
                    txt = f.read().strip().upper()
                mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(txt[-1:], 1)
                return int(txt.rstrip("KMG")) * mult
            except (OSError, ValueError):
                continue
    except OSError:
        pass
    return 2 << 20


def _nbytes(obj: Any) -> int:
    if isinstance(obj, (tuple, list)):  # a pair of outputs (add_rmsnorm)
        return sum(_nbytes(o) for o in obj)
    return int(obj.numel() * obj.element_size()) if hasattr(obj, "element_size") else 0


SPIN_CYCLES = 1_000_000  # ~0.5 ms of GPU spin at H200 clocks: longer than the host needs to enqueue one call


def time_call(fn: Callable[[], Any], cuda: bool) -> float:
    """Seconds one call of ``fn`` takes. On CUDA: the GPU time between two
    events, with the GPU held busy (``torch.cuda._sleep``) while the host
    enqueues the call, so the host's launch overhead is not counted (a
    short kernel timed without it measures the launch: 138 us for a 37 us
    kernel on an H200), which is what a CUDA graph replays. Elsewhere: the
    host clock."""
    import torch

    if cuda:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SPIN_CYCLES)
        a.record()
        fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _time_interleaved(fa: Callable[[int], Any], fb: Callable[[int], Any], n_sets: int, runs: int, warmup: int,
                      device: str) -> tuple[list[float], list[float]]:
    """Timed calls of ``fa`` and ``fb`` alternating (AB, BA, ...) on rotating
    input sets, after ``warmup`` untimed calls of each: a slow drift of the
    machine (another process, clocks) hits both sides alike."""
    import torch

    cuda = device.startswith("cuda")
    for i in range(warmup):
        fa(i % n_sets)
        fb(i % n_sets)
    if cuda:
        torch.cuda.synchronize()
    ta, tb = [], []
    for i in range(runs):
        k = (warmup + i) % n_sets
        if i % 2 == 0:
            ta.append(time_call(lambda: fa(k), cuda))
            tb.append(time_call(lambda: fb(k), cuda))
        else:
            tb.append(time_call(lambda: fb(k), cuda))
            ta.append(time_call(lambda: fa(k), cuda))
    return ta, tb


def microbenchmark(cand: KernelCandidate, device: str, *, runs: int = 50, warmup: int = 5,
                   min_speedup: float = MIN_SPEEDUP, max_sets: int = 64) -> GateResult:
    """Gate 2 (see the module docstring). Timed at the candidate's first (largest
    first is the backend's job) shape."""
    shape = cand.shapes[0]
    try:
        first, out0 = cand.make_inputs(shape, cand.dtype, device, 1000)
        per_set = sum(_nbytes(v) for v in first.values()) + _nbytes(out0)
        need = 2 * cache_bytes(device)
        n_sets = max(2, min(max_sets, math.ceil(need / max(per_set, 1))))
        sets = [(first, out0)] + [cand.make_inputs(shape, cand.dtype, device, 1001 + i) for i in range(n_sets - 1)]
        timed = (lambda k: cand.timed(**sets[k][0])) if cand.timed is not None else (
            lambda k: cand.implementation(**sets[k][0], out=sets[k][1]))
        t_base, t_impl = _time_interleaved(lambda k: cand.baseline(**sets[k][0]), timed, n_sets, runs, warmup, device)
    except Exception as exc:  # noqa: BLE001
        return GateResult("microbenchmark", False, "kernel_crashed",
                          f"{cand.id} raised {type(exc).__name__} in the microbenchmark: {crash_text(exc)}")
    mb, mi = statistics.median(t_base), statistics.median(t_impl)
    speedup = mb / mi if mi > 0 else math.inf
    details = {"shape": dict(shape), "runs": runs, "warmup": warmup, "input_sets": n_sets,
               "bytes_rotated": n_sets * per_set, "cache_bytes": need // 2,
               "rotation_exceeds_cache": n_sets * per_set > need // 2, "timer": "cuda events" if device.startswith("cuda") else "host clock",
               "baseline_median_s": mb, "kernel_median_s": mi, "speedup": speedup,
               "claimed_speedup": cand.claimed_speedup, "baseline_s": t_base, "kernel_s": t_impl,
               **({"timed": "the kernel as delivered, returning its result (no copy into out=)"} if cand.timed else {})}
    if speedup < min_speedup:
        return GateResult("microbenchmark", False, "kernel_not_faster",
                          f"{cand.id}: x{speedup:.3f} against {cand.op} (median {mi * 1e6:,.1f} vs {mb * 1e6:,.1f} us), "
                          f"below the x{min_speedup:.2f} a kernel must reach", details)
    return GateResult("microbenchmark", True, None,
                      f"{cand.id}: x{speedup:.3f} against {cand.op} (median {mi * 1e6:,.1f} vs {mb * 1e6:,.1f} us; "
                      f"claimed x{cand.claimed_speedup:.2f})", details)
