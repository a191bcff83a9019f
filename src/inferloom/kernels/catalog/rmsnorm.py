"""Fused residual add + RMSNorm (Triton), with HF ``LlamaRMSNorm`` numerics.

Replaces the decoder layer's ``hidden = residual + hidden; out = norm(hidden)``
(two kernels and a round trip of ``hidden`` through memory when eager) by one
kernel that writes both the new residual and the normalised output:

* ``residual_out = x + residual`` rounded to the input dtype (as HF adds in
  the model dtype);
* ``out = weight * (r * rsqrt(mean(r^2) + eps)).to(dtype)`` where ``r`` is
  ``residual_out`` in float32 (sum of squares accumulated in float32), the
  product with ``weight`` rounded once to the dtype, exactly HF's order.

Supports: rows of any hidden size up to 65536 (one program per row, the row
held in registers as a power-of-two block), any leading shape (flattened to
rows; the last dim must be contiguous), float32/float16/bfloat16 with a
weight of the same dtype. ``residual=None`` gives a plain RMSNorm.
``residual_out`` may alias ``residual`` (each element is read before it is
written, by the same program). Doesn't support: a weight offset (Gemma's
``1 + w``), bias, or a different weight dtype.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import triton
import triton.language as tl

from inferloom.kernels.catalog import tuning
from inferloom.kernels.catalog.entry import DTYPES, CatalogEntry, randn, rng

__all__ = ["fused_add_rmsnorm", "rmsnorm_reference", "hf_add_rmsnorm_baseline", "ENTRY"]

DEFAULT_CONFIG = {"num_warps": 8}
TUNE_SPACE = ({"num_warps": 4}, {"num_warps": 8}, {"num_warps": 16})


@triton.jit
def _add_rmsnorm_kernel(X, R, W, Out, ROut, n_cols, eps,
                        s_x, s_r, s_o, s_ro,
                        HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * s_x + cols, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(R + row * s_r + cols, mask=mask, other=0.0)
        # the add in float32, rounded once to the dtype (what torch does for x + r)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(ROut.dtype.element_ty)
        tl.store(ROut + row * s_ro + cols, x, mask=mask)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, 0) / n_cols
    normed = (xf * tl.rsqrt(var + eps)).to(X.dtype.element_ty)
    w = tl.load(W + cols, mask=mask, other=0.0)
    y = (w.to(tl.float32) * normed.to(tl.float32)).to(Out.dtype.element_ty)
    tl.store(Out + row * s_o + cols, y, mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    if t.stride(-1) != 1:
        raise ValueError("the last dim must be contiguous")
    return t.reshape(-1, t.shape[-1])


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float = 1e-5, *,
                      out: torch.Tensor | None = None, residual_out: torch.Tensor | None = None,
                      config: Mapping[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rmsnorm(x + residual) * weight, x + residual)``; see the module docstring."""
    n = x.shape[-1]
    block = triton.next_power_of_2(n)
    if block > 65536:
        raise ValueError(f"hidden size {n} > 65536 is not supported")
    if weight.shape != (n,) or weight.dtype != x.dtype:
        raise ValueError(f"weight {tuple(weight.shape)} {weight.dtype} for x {tuple(x.shape)} {x.dtype}")
    out = torch.empty_like(x) if out is None else out
    if residual is not None and residual_out is None:
        residual_out = torch.empty_like(x)
    x2, o2 = _rows(x), _rows(out)
    r2 = _rows(residual) if residual is not None else x2
    ro2 = _rows(residual_out) if residual is not None else o2
    if config is None:
        config = tuning.lookup("add_rmsnorm", str(x.dtype).removeprefix("torch."),
                               {"tokens": x2.shape[0], "hidden": n}, x.device, DEFAULT_CONFIG)
    cfg = dict(config)
    _add_rmsnorm_kernel[(x2.shape[0],)](
        x2, r2, weight, o2, ro2, n, float(eps),
        x2.stride(0), r2.stride(0), o2.stride(0), ro2.stride(0),
        HAS_RES=residual is not None, BLOCK=block, num_warps=int(cfg["num_warps"]),
    )
    return out, (residual_out if residual is not None else x)


def rmsnorm_reference(x, residual, weight, eps=1e-5):
    """float64 truth: ``(norm(x + residual) * weight, x + residual)``."""
    r = x.to(torch.float64) + (residual.to(torch.float64) if residual is not None else 0.0)
    y = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.to(torch.float64)
    return y, r


def hf_add_rmsnorm_baseline(x, residual, weight, eps=1e-5):
    """Eager HF: ``residual + hidden`` in the model dtype, then ``LlamaRMSNorm.forward``."""
    h = residual + x if residual is not None else x
    dt = h.dtype
    hs = h.to(torch.float32)
    var = hs.pow(2).mean(-1, keepdim=True)
    hs = hs * torch.rsqrt(var + eps)
    return weight * hs.to(dt), h


def make_inputs(shape: Mapping[str, int], dtype: str, device: str, seed: int):
    """Shape keys: ``tokens``, ``hidden``; ``no_residual=1`` for plain RMSNorm.
    Residual of scale 4 (a late layer's stream is larger than its update)."""
    dt = DTYPES[dtype]
    g = rng(device, seed)
    T, H = int(shape["tokens"]), int(shape["hidden"])
    x = randn(g, (T, H), dt)
    res = None if shape.get("no_residual") else randn(g, (T, H), dt, 4.0)
    w = (1 + randn(g, (H,), torch.float32, 0.1)).to(dt)
    out = (torch.empty_like(x), torch.empty_like(x))
    return {"x": x, "residual": res, "weight": w, "eps": 1e-5}, out


def _impl(x, residual, weight, eps=1e-5, *, out, config=None):
    o, ro = out
    if residual is None:
        fused_add_rmsnorm(x, None, weight, eps, out=o, config=config)
        ro.copy_(x)
    else:
        fused_add_rmsnorm(x, residual, weight, eps, out=o, residual_out=ro, config=config)


ENTRY = CatalogEntry(
    name="add_rmsnorm",
    target="norm",
    target_op="residual add + LlamaRMSNorm (pow/mean/rsqrt/mul in float32, weight mul in the dtype)",
    implementation=_impl,
    reference=rmsnorm_reference,
    baseline=hf_add_rmsnorm_baseline,
    make_inputs=make_inputs,
    # outputs are rounded to the dtype twice (normed, then * weight): bf16's 2^-8 ulp dominates
    tolerances={
        "float32": {"rel_l2": 1e-5, "max_rel": 1e-5},
        "float16": {"rel_l2": 2e-3, "max_rel": 2e-3},
        "bfloat16": {"rel_l2": 1e-2, "max_rel": 1.6e-2},
    },
    tune_space=TUNE_SPACE,
    default_config=DEFAULT_CONFIG,
    tune_keys=("tokens", "hidden"),
    notes="one program per row; both outputs written; HF rounding order",
)
