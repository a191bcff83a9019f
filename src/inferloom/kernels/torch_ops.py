"""torch's own operators for the ops the KERNEL phase rewrites: pure functions of tensors, the torch backend's
implementations and references (:mod:`inferloom.kernels.torch_backend`). The engines' switches deliver them into
a model (:mod:`inferloom.workloads.engine_attention`, :mod:`inferloom.workloads.engine_gate_up`,
:mod:`inferloom.workloads.engine_kernels`, :mod:`inferloom.workloads.diffusers_ops`).

* :func:`decode_reference`, :func:`sliced_decode`: a decode step's attention over ``[start, end)`` of each row of
  a static cache (``query [B, Hq, 1, D]``, ``key`` / ``value`` ``[B, Hkv, S, D]``, GQA); the float64 truth and
  ``attention_kernel=torch_sliced`` (SDPA over the cache up to the batch's longest valid end).
* :func:`gate_up_silu_torch`: the Llama MLP's front half as one GEMM over ``[Wg; Wu]`` and SiLU·mul
  (``mlp_kernel=torch_gate_up``).
* :func:`fused_rmsnorm`: RMSNorm with transformers' Llama numerics through torch's fused op
  (``rmsnorm_impl=torch_fused``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["decode_reference", "sliced_decode", "gate_up_silu_torch", "fused_rmsnorm"]


def _gqa(x: Any, rep: int) -> Any:
    return x if rep == 1 else x.repeat_interleave(rep, dim=1)


def decode_reference(query: Any, key: Any, value: Any, start: Any, end: Any, scale: float) -> Any:
    """Float64 truth: softmax(q k^T * scale) v over [start, end) of each row."""
    import torch

    b, hq, _, d = query.shape
    rep = hq // key.shape[1]
    k, v, q = _gqa(key, rep).double(), _gqa(value, rep).double(), query.double()
    s = k.shape[2]
    idx = torch.arange(s, device=query.device)
    ok = (idx[None, :] >= start[:, None]) & (idx[None, :] < end[:, None])  # [B, S]
    scores = (q @ k.transpose(-1, -2)) * scale  # [B, Hq, 1, S]
    scores = scores.masked_fill(~ok[:, None, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def sliced_decode(query: Any, key: Any, value: Any, start: Any, end: Any, scale: float) -> Any:
    """``torch_sliced``: SDPA over ``[0, max(end))`` of the cache only."""
    import torch

    n = int(end.max()) if end.numel() else 0
    n = max(n, 1)
    k, v = key[:, :, :n], value[:, :, :n]
    idx = torch.arange(n, device=query.device)
    ok = (idx[None, :] >= start[:, None]) & (idx[None, :] < end[:, None])
    rep = query.shape[1] // key.shape[1]
    return torch.nn.functional.scaled_dot_product_attention(
        query, _gqa(k, rep), _gqa(v, rep), attn_mask=ok[:, None, None, :], scale=scale)


def gate_up_silu_torch(x: Any, w_gate_up: Any, inter: int) -> Any:
    """``silu(x @ Wg^T) * (x @ Wu^T)`` as one GEMM over ``[Wg; Wu]`` and SiLU·mul."""
    import torch.nn.functional as F

    gu = F.linear(x, w_gate_up)
    return F.silu(gu[..., :inter]) * gu[..., inter:]


def fused_rmsnorm(hidden_states: Any, weight: Any, eps: float) -> Any:
    """RMSNorm with transformers' Llama numerics through torch's fused op."""
    import torch

    dt = hidden_states.dtype
    h = torch.nn.functional.rms_norm(hidden_states.to(torch.float32), (hidden_states.shape[-1],), None, eps)
    return weight * h.to(dt)
