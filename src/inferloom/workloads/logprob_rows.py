"""A full log-probability row rebuilt from a server's top-k (plus the scored token): the k known
log-probabilities kept, the rest of the probability mass spread uniformly over the other tokens, the row
renormalized (``log_softmax``); and :func:`each_prompt`, how a probe sends one request per prompt. Shared by
the server probes (``vllm_probes``, ``sglang_probes``)."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence, TypeVar

__all__ = ["topk_row", "each_prompt"]

_P = TypeVar("_P")
_R = TypeVar("_R")


def each_prompt(one: Callable[[_P], _R], prompts: Sequence[_P], concurrency: int) -> list[_R]:
    """``one(p)`` for every prompt, in prompt order: one at a time for ``concurrency`` <= 1 (the same
    batches on every server), else at most ``concurrency`` requests in flight."""
    if concurrency <= 1:
        return [one(p) for p in prompts]
    with ThreadPoolExecutor(max_workers=min(concurrency, len(prompts))) as ex:
        return list(ex.map(one, prompts))


def topk_row(entry: Mapping[int, float], vocab_size: int) -> Any:
    """A ``(vocab_size,)`` float32 tensor of log-probabilities from ``{token id: log-probability}``."""
    import torch  # optional dependency: only a quality probe needs it

    ids = torch.tensor([int(k) for k in entry], dtype=torch.long)
    lps = torch.tensor([float(v) for v in entry.values()], dtype=torch.float64)
    lps = torch.nan_to_num(lps, neginf=-1e4)
    mass = float(lps.exp().sum().clamp(max=1.0))
    rest = vocab_size - len(ids)
    fill = math.log(max(1.0 - mass, 1e-12) / rest) if rest > 0 else -1e4
    row = torch.full((vocab_size,), fill, dtype=torch.float64)
    if len(ids):
        row[ids] = lps
    return torch.log_softmax(row, dim=-1).float()
