"""Prompt sources for a workload: seeded random token ids, or texts from JSONL.

Every function is deterministic in its ``seed``; distinct seeds give distinct
prompts (fresh prompts per timed run, so no run can be served from a cache
warmed by an earlier one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from inferloom.errors import InferloomError

__all__ = ["PromptError", "random_prompts", "load_jsonl_texts", "text_prompts"]


class PromptError(InferloomError, ValueError):
    """A prompt source is unusable; the message is one line saying where and why."""


def random_prompts(
    seed: int,
    n: int,
    length: int,
    vocab_size: int,
    avoid_ids: Iterable[int] = (),
) -> list[list[int]]:
    """``n`` prompts of ``length`` token ids drawn uniformly from
    ``[0, vocab_size)`` minus ``avoid_ids`` (special tokens), with
    ``numpy.random.default_rng(seed)``."""
    if n < 0 or length < 1:
        raise ValueError(f"random_prompts: need n >= 0 and length >= 1, got n={n}, length={length}")
    avoid = np.array(sorted({int(i) for i in avoid_ids if 0 <= int(i) < vocab_size}), dtype=np.int64)
    allowed = np.setdiff1d(np.arange(vocab_size, dtype=np.int64), avoid, assume_unique=True)
    if allowed.size == 0:
        raise ValueError(f"random_prompts: no token ids left in [0, {vocab_size}) after removing special ids")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, allowed.size, size=(n, length))
    return allowed[idx].tolist()


def load_jsonl_texts(path: str | Path) -> list[str]:
    """The ``"text"`` field of every non-blank line of a JSONL file.

    Raises :class:`PromptError` naming the file (and line) when the file is
    missing, a line is not JSON, a line is not an object with a string
    ``"text"``, or no texts are found.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise PromptError(f"prompts file '{path}': not found; expected a JSONL file of {{\"text\": ...}} lines")
    texts: list[str] = []
    with p.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj: Any = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PromptError(f"prompts file '{path}': line {lineno} is not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict) or "text" not in obj:
                raise PromptError(f"prompts file '{path}': line {lineno} has no \"text\" key; expected {{\"text\": ...}}")
            if not isinstance(obj["text"], str) or not obj["text"].strip():
                raise PromptError(f"prompts file '{path}': line {lineno}: \"text\" must be a non-empty string")
            texts.append(obj["text"])
    if not texts:
        raise PromptError(f"prompts file '{path}': no texts found; expected at least one {{\"text\": ...}} line")
    return texts


def text_prompts(
    texts: Sequence[str],
    tokenizer: Any,
    length: int,
    seed: int,
    n: int,
) -> list[list[int]]:
    """Sample ``n`` texts with ``seed`` (without replacement while there are
    enough), tokenize each (with the tokenizer's special tokens, e.g. BOS) and
    truncate to ``length`` tokens. Shorter texts stay shorter (the engine pads
    on the left)."""
    if not texts:
        raise PromptError("text_prompts: no texts to sample from")
    if length < 1:
        raise ValueError(f"text_prompts: need length >= 1, got {length}")
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(texts), size=n, replace=n > len(texts))
    out: list[list[int]] = []
    for i in idx.tolist():
        ids = tokenizer(texts[i])["input_ids"]
        out.append([int(t) for t in ids[:length]])
    return out
