"""Decode attention over a static KV cache, as a transformers attention function.

transformers (5.x) calls a registered attention function with ``(module,
query [B, Hq, q, D], key [B, Hkv, S, D], value, attention_mask, dropout,
scaling, ...)`` and expects ``(output [B, q, Hq, D], None)``. With a static
cache, ``S`` is the cache's full length and the boolean mask ``[B, 1, q, S]``
marks the positions each sequence may attend to. The engine left-pads its
batches, so in a decode step (``q == 1``) each row's valid positions are one
contiguous range ``[start, end)``: :func:`ranges_from_mask` derives it with
tensor ops only (no host sync, so it stays inside a compiled graph).

Implementations (engine knob ``attention_kernel``):

* ``sdpa``: untouched (transformers' SDPA over the whole padded cache).
* ``torch_sliced``: SDPA over the cache sliced to the batch's longest valid
  end (``max(end)``), with the mask sliced alike: the padded tail past every
  row's end is never read (:func:`inferloom.kernels.torch_ops.sliced_decode`). The slice length is data-dependent, so it suits
  eager and dynamic-shape execution, not CUDA graphs. CPU and CUDA.
* ``triton_decode``: the kernel catalog's split-KV (flash-decoding) kernel,
  reading only ``[start, end)`` of each row (CUDA; wired in when the catalog
  provides it: :data:`DECODE_IMPLS`).

Prefill steps (``q > 1``) and calls without a boolean mask always go to
transformers' own SDPA path.
"""

from __future__ import annotations

from typing import Any, Callable

from inferloom.kernels.torch_ops import sliced_decode

__all__ = ["ranges_from_mask", "register", "DECODE_IMPLS", "ATTN_NAME"]

ATTN_NAME = "inferloom_decode"
# name -> fn(query [B,Hq,1,D], key [B,Hkv,S,D], value, start [B], end [B], scale) -> [B,Hq,1,D]
DECODE_IMPLS: dict[str, Callable[..., Any]] = {}


def ranges_from_mask(mask: Any) -> tuple[Any, Any]:
    """``(start, end)`` int64 [B] of the True range in each row of a boolean
    ``[B, 1, 1, S]`` (or ``[B, S]``) mask (a row with none gives start = end = 0)."""
    import torch

    valid = mask.reshape(mask.shape[0], mask.shape[-1])
    s = valid.shape[-1]
    any_ = valid.any(dim=-1)
    idx = torch.arange(s, device=valid.device)
    start = torch.where(valid, idx, s).amin(dim=-1)
    end = torch.where(valid, idx + 1, 0).amax(dim=-1)
    return torch.where(any_, start, 0), torch.where(any_, end, 0)


DECODE_IMPLS["torch_sliced"] = sliced_decode


def triton_decode(query: Any, key: Any, value: Any, start: Any, end: Any, scale: float) -> Any:
    """``triton_decode``: the catalog's split-KV kernel as a compile-safe custom op."""
    import torch

    from inferloom.kernels.catalog import ops

    return ops.decode_attention(query, key, value, end.to(torch.int32), start.to(torch.int32), scale)


def _make_attention(impl: Callable[..., Any]) -> Callable[..., Any]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
                  scaling: float | None = None, **kwargs: Any) -> tuple[Any, None]:
        import torch

        if (query.shape[2] != 1 or attention_mask is None or attention_mask.dtype != torch.bool
                or dropout or kwargs.get("softcap") is not None):
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        start, end = ranges_from_mask(attention_mask)
        out = impl(query, key, value, start, end, scale)  # [B, Hq, 1, D]
        return out.transpose(1, 2).contiguous(), None

    return attention


def register(impl_name: str, impl: Callable[..., Any] | None = None) -> str:
    """Register the attention function for ``impl_name`` with transformers
    (and SDPA's mask builder under the same name); returns the name to set as
    the model's attention implementation. ``impl``: a decode function to add
    to :data:`DECODE_IMPLS` under ``impl_name`` first (a written kernel's,
    ``llm_kernel``: :mod:`inferloom.kernels.written`)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if impl is not None:
        DECODE_IMPLS[impl_name] = impl
    if impl_name == "triton_decode" and impl_name not in DECODE_IMPLS:
        DECODE_IMPLS[impl_name] = triton_decode
    if impl_name not in DECODE_IMPLS:
        raise ValueError(f"attention_kernel={impl_name!r}: not available here (have {sorted(DECODE_IMPLS)})")
    name = f"{ATTN_NAME}_{impl_name}"
    AttentionInterface.register(name, _make_attention(DECODE_IMPLS[impl_name]))
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
