"""Plug the decode-attention kernel into HF transformers (5.x) as an attention implementation.

:func:`register` adds ``attn_implementation="inferloom_decode"`` (the name is
a parameter): HF's SDPA boolean mask (``sdpa_mask``) and, per layer,

* one query token with a mask (decode over a static or dynamic cache): the
  row's attended range is read off the mask, ``starts[b]`` = its first True
  slot and ``seq_lens[b]`` = its last True slot + 1, then
  ``torch.ops.inferloom.decode_attention`` over ``[starts, seq_lens)`` of the
  cache tensors HF passes (no ``repeat_kv``, no reading of the padded tail);
* anything else (prefill, no mask, dropout, softcap): HF's own
  ``sdpa_attention_forward``, unchanged.

It assumes each row's True slots are contiguous (left padding + causal at
decode: ``[pad_b, position]``); sliding-window or packed-sequence masks are
not contiguous and are not supported (they would attend to the gap). Reading
the range off the mask costs two small reductions per layer.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["register", "decode_attention_forward", "NAME"]

NAME = "inferloom_decode"


def decode_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, dropout: float = 0.0,
                             scaling: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (query.shape[2] != 1 or attention_mask is None or attention_mask.dtype != torch.bool or dropout
            or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    from inferloom.kernels.catalog import ops

    valid = attention_mask[:, 0, -1, :]  # [B, S] (the mask may broadcast over batch)
    S = key.shape[2]
    valid = valid[:, :S].expand(query.shape[0], S)
    idx = torch.arange(S, device=query.device, dtype=torch.int32)
    seq_lens = torch.where(valid, idx + 1, 0).amax(-1).to(torch.int32)
    starts = torch.where(valid, idx, S).amin(-1).to(torch.int32)
    out = ops.decode_attention(query, key, value, seq_lens, starts, scaling)  # [B, H, 1, D]
    return out.transpose(1, 2), None  # HF expects [B, q_len, H, D]


def register(name: str = NAME) -> str:
    """Register the attention function and its mask under ``name``; returns ``name``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, decode_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
