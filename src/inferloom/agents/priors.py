"""Expert priors: change-sets worth trying first, ranked for the workload.

Contract:

* A :class:`Prior` is one change-set (knob name -> value) with the conditions
  under which it is worth trying (devices, the current dtype, a concurrency
  range), a ``rank`` (lower is tried earlier), a ``predicted_gain`` and a
  rationale. ``predicted_gain`` is a rough, documented guess of the relative
  throughput gain (0.25 = +25%); it is logged beside the measured gain for
  calibration and decides nothing.
* For an int knob a value may be the symbol ``"max"`` or ``"min"``: the knob's
  ``high`` / ``low`` (resolved by the orchestrator against the knob domain).
* :func:`rank_priors` keeps the priors whose conditions hold for ``(device,
  concurrency, dtype)`` and sorts them by ``rank`` (stable). It knows nothing
  about the knob space: a prior that names an unknown knob, a knob that does
  not apply to the device, or a value outside the domain is skipped by the
  orchestrator, never an error.
* The numbers come from this project's own measurements (docs/benchmarks.md,
  ../shared/FACTS.md) where there are any, else they are a guess said to be one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

__all__ = ["Prior", "DEFAULT_PRIORS", "rank_priors"]

_HALF = frozenset({"bfloat16", "float16"})
_FP32 = frozenset({"float32"})
# Up to this concurrency, per-step launch overhead dominates eager decode on a
# GPU, so CUDA graphs (reduce-overhead) pay most (a rough threshold).
SMALL_BATCH = 64


@dataclass(frozen=True, eq=False)
class Prior:
    """One expert change-set and where it applies (see the module docstring)."""

    name: str
    changes: Mapping[str, Any]
    predicted_gain: float
    rationale: str
    devices: frozenset[str]
    rank: float
    dtypes: frozenset[str] | None = None  # the current dtype must be one of these
    min_concurrency: int = 1
    max_concurrency: int | None = None

    def applies(self, device: str, concurrency: int, dtype: str | None) -> bool:
        if device not in self.devices:
            return False
        if self.dtypes is not None and dtype not in self.dtypes:
            return False
        if concurrency < self.min_concurrency:
            return False
        return self.max_concurrency is None or concurrency <= self.max_concurrency

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Prior":
        """Build from a JSON-like dict (e.g. a knowledge-base record)."""
        dtypes = d.get("dtypes")
        return cls(
            name=str(d["name"]),
            changes=dict(d["changes"]),
            predicted_gain=float(d.get("predicted_gain", 0.0)),
            rationale=str(d.get("rationale", "")),
            devices=frozenset(d.get("devices", ("cpu", "cuda"))),
            rank=float(d.get("rank", 100.0)),
            dtypes=frozenset(dtypes) if dtypes is not None else None,
            min_concurrency=int(d.get("min_concurrency", 1)),
            max_concurrency=None if d.get("max_concurrency") is None else int(d["max_concurrency"]),
        )


_CUDA = frozenset({"cuda"})
_CPU = frozenset({"cpu"})

DEFAULT_PRIORS: tuple[Prior, ...] = (
    # ---------------------------------------------------------------- CUDA
    Prior(
        "static-cache+cuda-graphs", {"cache_implementation": "static", "compile_mode": "reduce-overhead"},
        0.5,
        "fixed-shape KV cache lets CUDA graphs replay the whole decode step, removing the per-step "
        "launch overhead that bounds eager decode at small/moderate batch (measured 1.77x on H200, "
        "llama-3.1-8b bf16, concurrency 64: docs/benchmarks.md)",
        _CUDA, rank=10, max_concurrency=SMALL_BATCH,
    ),
    Prior(
        "static-loop+cuda-graphs",
        {"cache_implementation": "static", "compile_mode": "reduce-overhead", "decode_loop": "static_loop"},
        0.1,
        "decode the CUDA-graph step in inferloom's own loop instead of generate(): generate()'s per-step "
        "host work and device sync leave the GPU idle between graph replays (25% of the H200 campaign's "
        "final run: docs/benchmarks.md section 8; FACTS.md measured +8% for such a loop; guess)",
        _CUDA, rank=15, max_concurrency=SMALL_BATCH,
    ),
    Prior(
        "static-cache+compile", {"cache_implementation": "static", "compile_mode": "default"},
        0.2,
        "static cache with a compiled decode step: fused kernels, fixed shapes (FACTS.md: +18-26% "
        "at batch 64 on H200); at large batch preferred over CUDA graphs, which capture more memory",
        _CUDA, rank=20,
    ),
    Prior(
        "static-cache+cuda-graphs", {"cache_implementation": "static", "compile_mode": "reduce-overhead"},
        0.15,
        "CUDA graphs still cut launch overhead at large batch, but the GPU is busier there, so "
        "less is left to gain (guess)",
        _CUDA, rank=25, min_concurrency=SMALL_BATCH + 1,
    ),
    Prior(
        "compile", {"compile_mode": "default"}, 0.1,
        "torch.compile of the forward with the dynamic cache: fused elementwise kernels; "
        "recompiles as shapes grow, so a smaller gain than with the static cache (guess)",
        _CUDA, rank=30,
    ),
    Prior(
        "fuse-qkv", {"fuse_qkv": True}, 0.03,
        "image pipelines: one QKV GEMM instead of three per attention (diffusers' fuse_qkv_projections; "
        "guess)", _CUDA, rank=32,
    ),
    Prior(
        "channels-last", {"channels_last": True}, 0.05,
        "image pipelines: channels_last convolutions for the UNet and the VAE decoder (cuDNN's "
        "preferred layout in half precision; guess)", _CUDA, rank=33, dtypes=_HALF,
    ),
    Prior(
        "tf32", {"tf32_matmul": True}, 0.1,
        "TF32 tensor cores for float32 matmuls: large for prefill, small for bandwidth-bound "
        "decode (guess)",
        _CUDA, rank=35, dtypes=_FP32,
    ),
    Prior(
        "sdpa-flash", {"sdpa_backend": "flash"}, 0.03,
        "force the flash SDPA kernel (half precision only); attention is a small share of "
        "decode time at short context (guess)",
        _CUDA, rank=40, dtypes=_HALF,
    ),
    Prior(
        "sdpa-cudnn", {"sdpa_backend": "cudnn"}, 0.03,
        "force cuDNN's SDPA kernel (half precision only; guess)",
        _CUDA, rank=41, dtypes=_HALF,
    ),
    Prior(
        "bf16", {"dtype": "bfloat16"}, 0.4,
        "half the bytes per weight for bandwidth-bound decode; changes numerics, so tried late "
        "and the quality contract decides (guess)",
        _CUDA, rank=90, dtypes=_FP32,
    ),
    # ----------------------------------------------------------------- CPU
    Prior(
        "compile", {"compile_mode": "default"}, 0.3,
        "torch.compile fuses the many small ops of eager decode (measured 1.395x on CPU, "
        "llama-tiny fp32, concurrency 8: docs/benchmarks.md)",
        _CPU, rank=10,
    ),
    Prior(
        "static-cache+compile", {"cache_implementation": "static", "compile_mode": "default"},
        0.3,
        "static cache gives the compiled decode step fixed shapes (no recompiles; guess)",
        _CPU, rank=20,
    ),
    Prior(
        "static-loop+compile",
        {"cache_implementation": "static", "compile_mode": "default", "decode_loop": "static_loop"}, 0.05,
        "the compiled decode step in inferloom's own loop: no generate() host work per step (guess)",
        _CPU, rank=25,
    ),
    Prior(
        "static-cache", {"cache_implementation": "static"}, 0.02,
        "preallocated cache avoids per-step concatenation but attends over the padded length "
        "(measured +4.3% at concurrency 8, -7% at concurrency 4 on llama-tiny: docs/benchmarks.md)",
        _CPU, rank=30,
    ),
    Prior(
        "sdpa-flash", {"sdpa_backend": "flash"}, 0.03,
        "torch's CPU flash-attention kernel (guess)", _CPU, rank=40,
    ),
    Prior(
        "all-threads", {"cpu_threads": "max"}, 0.05,
        "use every core for intra-op parallelism (guess; no numerics change)", _CPU, rank=50,
    ),
    Prior(
        "bf16", {"dtype": "bfloat16"}, 0.1,
        "bf16 matmuls on CPUs with AMX / AVX-512-BF16; changes numerics, so tried late (guess)",
        _CPU, rank=90, dtypes=_FP32,
    ),
)


def rank_priors(
    device: str,
    concurrency: int,
    dtype: str | None,
    table: Iterable[Prior | Mapping[str, Any]] | None = None,
) -> list[Prior]:
    """Priors of ``table`` (default :data:`DEFAULT_PRIORS`) that apply to the
    workload, best first (by ``rank``, ties in table order)."""
    source = DEFAULT_PRIORS if table is None else table
    items = [p if isinstance(p, Prior) else Prior.from_dict(p) for p in source]
    return sorted((p for p in items if p.applies(device, concurrency, dtype)), key=lambda p: p.rank)
