"""Greedy decoding over a static KV cache without ``generate()``'s per-step
host work (the engine's ``decode_loop=static_loop``).

transformers' ``generate()`` does host work around every decode step (input
preparation, logits processors, stopping criteria, the growing attention
mask) and synchronises with the device once per step to ask whether every
sequence is finished. With CUDA graphs the step itself is one graph replay,
so that host work shows up as idle GPU time between replays: 25% of the
H200 campaign's final run (docs/benchmarks.md, section 8).

:func:`greedy_static` does what ``generate()`` does for greedy decoding with
a static cache and EOS disabled (every row produces exactly ``new_tokens``),
and nothing else:

1. prefill: the uncompiled forward over the left-padded prompts with the
   cache, ``logits_to_keep=1`` (a compiled prefill would be one more graph
   per prompt length; transformers doesn't compile it either);
2. each decode step: the configuration's forward (compiled when
   ``compile_mode`` is on: a CUDA-graph replay under reduce-overhead) on the
   last tokens, their positions, and the full-length attention mask, which
   stays the same tensor for the whole batch (padding masked, the future
   masked by causality);
3. the argmax stays on the device and is written into a preallocated output;
   positions come from one precomputed tensor. Nothing in the loop reads a
   device value on the host, so the host enqueues steps ahead of the GPU.

The cache is one ``StaticCache`` per (batch, length) per prepared
configuration, reset between calls: CUDA graphs need its tensors at the same
addresses every replay (transformers marks them static).

transformers renamed the forward's cache argument (``past_key_values`` up to
5.2x, ``cache`` later); :func:`cache_kwarg` picks the one the model takes.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

__all__ = ["greedy_static", "cache_kwarg", "LOOPS"]

LOOPS = ("generate", "static_loop")


def cache_kwarg(model: Any) -> str:
    """The name under which ``model``'s forward takes its KV cache."""
    params = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    inner = getattr(model, "model", None)  # a *ForCausalLM passing **kwargs through
    if inner is not None and inner is not model:
        return cache_kwarg(inner)
    raise TypeError(f"{type(model).__name__}.forward takes neither `cache` nor `past_key_values`")


def _cache(model: Any, caches: dict[tuple[int, int], Any], batch: int, length: int) -> Any:
    from transformers import StaticCache

    c = caches.get((batch, length))
    if c is None:
        c = StaticCache(config=model.config, max_cache_len=length)
        caches[(batch, length)] = c
    else:
        c.reset()
    return c


def greedy_static(model: Any, prefill: Callable[..., Any], step: Callable[..., Any], ids: Any, mask: Any,
                  new_tokens: int, caches: dict[tuple[int, int], Any], *,
                  keep_logits: bool = False) -> tuple[Any, list[Any]]:
    """Greedy continuation of the left-padded batch ``ids`` / ``mask``
    ([b, w]): ``(tokens [b, new_tokens] on the device, per-step float32
    logits [b, V] when keep_logits)``. ``prefill`` and ``step`` are forwards
    of ``model`` (``step`` compiled or not)."""
    import torch

    if new_tokens < 1:
        raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
    b, width = ids.shape
    kw = cache_kwarg(model)
    cache = _cache(model, caches, b, width + new_tokens)
    full = torch.cat([mask, mask.new_ones((b, new_tokens))], dim=1)  # [b, w + new]: same tensor every step
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    # positions of the decode steps' inputs: the token after the prompt's last, then one more per step
    step_pos = pos[:, -1:] + 1 + torch.arange(new_tokens - 1, device=ids.device)[None, :]
    out = torch.empty((b, new_tokens), dtype=torch.long, device=ids.device)
    rows: list[Any] = []
    o = prefill(input_ids=ids, attention_mask=full[:, :width], position_ids=pos, use_cache=True,
                logits_to_keep=1, **{kw: cache})
    last = o.logits[:, -1, :]
    tok = last.argmax(-1)
    out[:, 0] = tok
    if keep_logits:
        rows.append(last.float())
    # a new CUDA-graph "step" each call: the previous step's outputs (already
    # consumed by argmax) may be overwritten by the replay
    mark = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None) if step is not prefill else None
    for t in range(new_tokens - 1):
        if mark is not None:
            mark()
        o = step(input_ids=tok[:, None], attention_mask=full, position_ids=step_pos[:, t:t + 1], use_cache=True,
                 logits_to_keep=1, **{kw: cache})
        last = o.logits[:, -1, :]
        tok = last.argmax(-1)
        out[:, t + 1] = tok
        if keep_logits:
            rows.append(last.float())
    return out, rows
