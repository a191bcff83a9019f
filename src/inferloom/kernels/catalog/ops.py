"""The catalog's kernels as torch custom ops (``torch.ops.inferloom.*``).

``torch.compile`` cannot trace through the launchers (Python logic, the tuning
cache lookup), so a model that calls them directly would break its graph.
Wrapped as custom ops with a fake (shape-only) implementation, each call is
one opaque node in the compiled graph (``fullgraph=True`` holds) and is
captured by CUDA graphs like any other kernel launch. The ops are functional
(they return new tensors); each is registered once per process.

* ``torch.ops.inferloom.decode_attention(q, k_cache, v_cache, seq_lens, starts, scale)``
* ``torch.ops.inferloom.add_rmsnorm(x, residual, weight, eps) -> (out, new_residual)``
* ``torch.ops.inferloom.gate_up_silu(x, w_gate_up)``
* ``torch.ops.inferloom.silu_mul(gu)``
"""

from __future__ import annotations

from typing import Optional

import torch

from inferloom.kernels.catalog import decode_attention as _da
from inferloom.kernels.catalog import mlp as _mlp
from inferloom.kernels.catalog import rmsnorm as _rms

__all__ = ["decode_attention", "add_rmsnorm", "gate_up_silu", "silu_mul"]


def _registered(name: str) -> bool:
    return hasattr(torch.ops, "inferloom") and hasattr(torch.ops.inferloom, name)


if not _registered("decode_attention"):
    @torch.library.custom_op("inferloom::decode_attention", mutates_args=())
    def _decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_lens: torch.Tensor,
                          starts: Optional[torch.Tensor], scale: float) -> torch.Tensor:
        return _da.decode_attention(q, k_cache, v_cache, seq_lens, starts, scale)

    @_decode_attention.register_fake
    def _(q, k_cache, v_cache, seq_lens, starts, scale):
        return torch.empty_like(q, memory_format=torch.contiguous_format)

if not _registered("add_rmsnorm"):
    @torch.library.custom_op("inferloom::add_rmsnorm", mutates_args=())
    def _add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        return _rms.fused_add_rmsnorm(x, residual, weight, eps)

    @_add_rmsnorm.register_fake
    def _(x, residual, weight, eps):
        return torch.empty_like(x), torch.empty_like(x)

if not _registered("gate_up_silu"):
    @torch.library.custom_op("inferloom::gate_up_silu", mutates_args=())
    def _gate_up_silu(x: torch.Tensor, w_gate_up: torch.Tensor) -> torch.Tensor:
        return _mlp.gate_up_silu(x, w_gate_up)

    @_gate_up_silu.register_fake
    def _(x, w_gate_up):
        return x.new_empty((*x.shape[:-1], w_gate_up.shape[0] // 2))

if not _registered("silu_mul"):
    @torch.library.custom_op("inferloom::silu_mul", mutates_args=())
    def _silu_mul(gu: torch.Tensor) -> torch.Tensor:
        return _mlp.silu_mul(gu)

    @_silu_mul.register_fake
    def _(gu):
        return gu.new_empty((*gu.shape[:-1], gu.shape[-1] // 2))


def decode_attention(q, k_cache, v_cache, seq_lens, starts=None, scale=None):
    """Compile-safe :func:`decode_attention.decode_attention` (scale default ``1/sqrt(D)``)."""
    return torch.ops.inferloom.decode_attention(q, k_cache, v_cache, seq_lens, starts,
                                                q.shape[-1] ** -0.5 if scale is None else float(scale))


def add_rmsnorm(x, residual, weight, eps=1e-5):
    """Compile-safe fused residual add + RMSNorm: ``(out, new_residual)``."""
    return torch.ops.inferloom.add_rmsnorm(x, residual, weight, float(eps))


def gate_up_silu(x, w_gate_up):
    return torch.ops.inferloom.gate_up_silu(x, w_gate_up)


def silu_mul(gu):
    return torch.ops.inferloom.silu_mul(gu)
