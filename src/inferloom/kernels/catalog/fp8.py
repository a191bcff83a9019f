"""fp8 (e4m3) linear with per-row activation scales and per-channel weight scales.

Replaces a bf16 ``F.linear(x, W)`` by: quantise ``W`` once (per output
channel, :func:`quantize_weight`), quantise ``x`` per row at each call
(dynamic), then ``torch._scaled_mm`` (cuBLAS fp8 GEMM, bf16 output) with the
row and channel scales. Hopper (compute capability 9.0) or newer, CUDA only:
there is no CPU path (the entry declares ``supported_devices=("cuda",)``).

This changes the numerics well beyond bf16 rounding (e4m3 has 3 mantissa
bits): the declared tolerance (``rel_l2`` 8e-2 against the float64 product
of the *unquantised* operands, about twice the 3.8% that the quantisation
alone gives at the 8B shape, simulated on CPU in float64) only says the
kernel is a faithful fp8 GEMM;
whether the model keeps its quality is the quality contract's call, end to
end. The activation quantisation is a separate torch op here (amax, divide,
cast: a few small kernels per call); fusing it into the previous kernel's
epilogue is not done.
"""

from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F

from inferloom.kernels.catalog.entry import DTYPES, CatalogEntry, randn, rng

__all__ = ["quantize_weight", "quantize_rows", "fp8_linear", "ENTRY"]

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row e4m3 quantisation: ``(q [R, C] e4m3, scale [R, 1] float32)``, ``t ≈ q * scale``."""
    amax = t.abs().amax(dim=-1, keepdim=True).to(torch.float32).clamp(min=1e-12)
    scale = amax / E4M3_MAX
    q = (t.to(torch.float32) / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, scale


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Once at load: ``W [N, K]`` to e4m3 per output channel; scale returned as ``[1, N]``."""
    q, scale = quantize_rows(w)
    return q, scale.reshape(1, -1).contiguous()


def fp8_linear(x: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor, *,
               out_dtype: torch.dtype = torch.bfloat16, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x [M, K] @ W^T`` through an e4m3 GEMM; ``(w_fp8, w_scale) = quantize_weight(W)``."""
    xq, xs = quantize_rows(x)
    y = torch._scaled_mm(xq, w_fp8.t(), scale_a=xs, scale_b=w_scale, out_dtype=out_dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y


def _inputs(shape: Mapping[str, int], dtype: str, device: str, seed: int):
    """Shape keys: ``tokens``, ``in_features``, ``out_features`` (multiples of 16)."""
    dt = DTYPES[dtype]
    g = rng(device, seed)
    M, K, N = int(shape["tokens"]), int(shape["in_features"]), int(shape["out_features"])
    x = randn(g, (M, K), dt)
    w = randn(g, (N, K), dt, K ** -0.5)
    wq, ws = quantize_weight(w)
    return {"x": x, "w": w, "w_fp8": wq, "w_scale": ws}, torch.empty((M, N), dtype=dt, device=device)


def _reference(x, w, w_fp8, w_scale):
    return x.to(torch.float64) @ w.to(torch.float64).t()


def _baseline(x, w, w_fp8, w_scale):
    return F.linear(x, w)


def _impl(x, w, w_fp8, w_scale, *, out, config=None):
    fp8_linear(x, w_fp8, w_scale, out_dtype=out.dtype, out=out)


ENTRY = CatalogEntry(
    name="fp8_linear",
    target="matmul",
    target_op="F.linear in bf16 (any projection) -> e4m3 GEMM with row/channel scales",
    implementation=_impl,
    reference=_reference,
    baseline=_baseline,
    make_inputs=_inputs,
    tolerances={"bfloat16": {"rel_l2": 8e-2, "max_rel": 1.2e-1}},
    supported_devices=("cuda",),
    supported_dtypes=("bfloat16",),
    needs_cuda_capability=(9, 0),
    notes="torch._scaled_mm (cuBLAS fp8); activation quantised per row at each call",
)
