"""Device ceilings: the memory bandwidth and matmul rate this device reaches.

:func:`measure_ceilings` measures the device's two ceilings: memory
bandwidth (a large copy, bytes read + written) and matmul rate (a large
square matmul in the workload dtype). Medians over timed repetitions after
a warm-up. Measure once per device and cache (the dict carries its date).
The roofline (:mod:`inferloom.measure.roofline`) divides the cost model's
bytes and FLOPs (:mod:`inferloom.measure.costs`) by them.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import statistics
import time
from typing import Any, Callable

from inferloom.models.presets import parse_dtype
from inferloom.provenance import cpu_model

__all__ = ["measure_ceilings"]


def _cpu_name() -> str:
    return cpu_model()


def _time_median(fn: Callable[[], None], sync: Callable[[], None], warmup: int, runs: int,
                 budget_s: float | None = None) -> list[float]:
    """Per-call seconds of ``fn`` (host clock around ``fn`` + ``sync``),
    after ``warmup`` untimed calls; stops early once ``budget_s`` is spent
    (at least 3 samples)."""
    for _ in range(warmup):
        fn()
    sync()
    samples: list[float] = []
    spent = 0.0
    for i in range(runs):
        t0 = time.perf_counter()
        fn()
        sync()
        dt = time.perf_counter() - t0
        samples.append(dt)
        spent += dt
        if budget_s is not None and i >= 2 and spent > budget_s:
            break
    return samples


def _cuda_time(fn: Callable[[], None], warmup: int, runs: int, inner: int = 1) -> list[float]:
    """Per-call seconds of ``fn`` from CUDA events (``inner`` calls per sample)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples: list[float] = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / inner)
    return samples


def _measure(dev: Any, on_cuda: bool, nbytes: int, tdtype: Any, matmul_n: int | None) -> tuple:
    """(bandwidth, copy samples, median copy s, n, flop rate, matmul samples, median matmul s)."""
    import torch

    def sync() -> None:
        if on_cuda:
            torch.cuda.synchronize(dev)

    # -- bandwidth
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    src.fill_(1)
    dst = torch.empty_like(src)
    copy = lambda: dst.copy_(src)  # noqa: E731
    if on_cuda:
        bw_samples = _cuda_time(copy, warmup=3, runs=10)
    else:
        bw_samples = _time_median(copy, sync, warmup=2, runs=8, budget_s=1.5)
    bw_s = statistics.median(bw_samples)
    bandwidth = 2.0 * nbytes / bw_s
    del src, dst

    # -- matmul
    n = int(matmul_n or (8192 if on_cuda else 1024))
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    a = torch.randn(n, n, device=dev, generator=gen, dtype=torch.float32).to(tdtype)
    b = torch.randn(n, n, device=dev, generator=gen, dtype=torch.float32).to(tdtype)
    out = torch.empty(n, n, device=dev, dtype=tdtype)
    mm = lambda: torch.matmul(a, b, out=out)  # noqa: E731
    if on_cuda:
        mm_samples = _cuda_time(mm, warmup=3, runs=10, inner=3)
    else:
        mm_samples = _time_median(mm, sync, warmup=1, runs=8, budget_s=1.5)
    mm_s = statistics.median(mm_samples)
    flops = 2.0 * n**3 / mm_s
    del a, b, out
    if on_cuda:
        torch.cuda.empty_cache()

    return bandwidth, bw_samples, bw_s, n, flops, mm_samples, mm_s


def measure_ceilings(
    device: str = "cpu",
    dtype: str | None = None,
    *,
    copy_bytes: int | None = None,
    matmul_n: int | None = None,
) -> dict[str, Any]:
    """Measure memory bandwidth and matmul rate of ``device`` ("cpu", "cuda" or "cuda:N").

    Bandwidth: ``dst.copy_(src)`` of one buffer of ``copy_bytes`` (CUDA: 1 GiB,
    capped at a quarter of free memory; CPU: 256 MiB, beyond last-level
    caches), counted as bytes read + written (``2 * copy_bytes``) per copy;
    median over timed repetitions after warm-up copies.
    Matmul: ``a @ b`` of two ``n x n`` matrices in ``dtype`` (default
    bfloat16 on CUDA, float32 on CPU; CUDA n=8192, CPU n=1024), ``2 n^3``
    FLOPs per product; median after warm-up. On CPU the whole measurement
    takes a few seconds at most, with the current torch thread count.

    Returns ``memory_bandwidth_bytes_per_s``, ``matmul_flops_per_s``,
    ``matmul_dtype``, ``device``, ``device_name``, ``measured_at`` (ISO UTC),
    ``date``, ``torch_version``, ``threads`` (CPU), ``bandwidth`` and
    ``matmul`` (sizes, samples), and ``key`` (device name + dtype: what to
    cache the ceilings under).
    """
    import torch

    dev = torch.device(device)
    on_cuda = dev.type == "cuda"
    if on_cuda and not torch.cuda.is_available():
        raise RuntimeError(f"measure_ceilings: device {device!r} requested but CUDA is not available")
    dtype = dtype or ("bfloat16" if on_cuda else "float32")
    tdtype = parse_dtype(dtype)
    if on_cuda:
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        name = torch.cuda.get_device_name(dev)
        free, _total = torch.cuda.mem_get_info(dev)
        nbytes = int(copy_bytes or min(1 << 30, free // 4))
    else:
        name = _cpu_name()
        nbytes = int(copy_bytes or (256 << 20))
    nbytes = max(1 << 20, nbytes - nbytes % 4096)

    with torch.cuda.device(dev) if on_cuda else contextlib.nullcontext():
        bandwidth, bw_samples, bw_s, n, flops, mm_samples, mm_s = _measure(
            dev, on_cuda, nbytes, tdtype, matmul_n
        )

    now = _dt.datetime.now(_dt.timezone.utc)
    return {
        "device": dev.type,
        "device_name": name,
        "measured_at": now.isoformat(timespec="seconds"),
        "date": now.date().isoformat(),
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads() if not on_cuda else None,
        "memory_bandwidth_bytes_per_s": float(bandwidth),
        "matmul_flops_per_s": float(flops),
        "matmul_dtype": dtype,
        "bandwidth": {
            "method": "dst.copy_(src), bytes read + written",
            "bytes_per_copy": nbytes,
            "samples_s": [float(x) for x in bw_samples],
            "median_s": float(bw_s),
        },
        "matmul": {
            "method": "a @ b, n x n, 2 n^3 FLOPs",
            "n": n,
            "dtype": dtype,
            "samples_s": [float(x) for x in mm_samples],
            "median_s": float(mm_s),
        },
        "key": f"{name}|{dtype}",
    }

