"""Prompt sources for a workload: seeded random token ids, or texts from JSONL.

Every function is deterministic in its ``seed``; distinct seeds give distinct
prompts (fresh prompts per timed run, so no run can be served from a cache
warmed by an earlier one).

A fixed pool of texts is drawn by one rule, every engine's (:func:`pool_window`):
one fixed shuffle of the pool read as a ring, run ``seed`` taking the ``n`` texts
from position ``seed * n``. The pairs of a comparison run on consecutive seeds
(``seed_base + i``), so they take consecutive, disjoint windows: no text is sent
twice in a comparison until the pool is used up (runs x ``n`` > pool size), and
then the ring wraps around (the run's ``cache_state`` says where it stands:
:func:`pool_state`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from inferloom.errors import InferloomError

__all__ = ["PromptError", "random_prompts", "load_jsonl_texts", "pool_window", "pool_state", "tokenize_texts",
           "text_prompts", "window_prompts"]

#: the seed of the one fixed shuffle of a text pool (:func:`pool_window`)
POOL_SHUFFLE_SEED = 31_000_031


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


def pool_window(pool_size: int, seed: int, n: int) -> list[int]:
    """The pool indices run ``seed`` draws: ``n`` consecutive entries, from position ``seed * n``, of one fixed
    shuffle of ``range(pool_size)`` read as a ring (the module docstring's rule). Pure."""
    if pool_size < 1:
        raise PromptError("no texts to draw from")
    if n < 0:
        raise ValueError(f"pool_window: need n >= 0, got {n}")
    perm = np.random.default_rng(POOL_SHUFFLE_SEED).permutation(pool_size)
    start = (int(seed) * n) % pool_size
    return [int(perm[(start + j) % pool_size]) for j in range(n)]


def pool_state(pool_size: int, seed: int, n: int) -> dict[str, int]:
    """Where run ``seed`` stands in the ring of :func:`pool_window`: its start position, the pool size, and
    ``disjoint_runs``: how many consecutive runs draw disjoint windows (a text repeats only beyond them)."""
    return {"pool_size": pool_size, "window_start": (int(seed) * n) % pool_size if pool_size else 0,
            "disjoint_runs": pool_size // n if n else 0}


def tokenize_texts(texts: Sequence[str], tokenizer: Any, where: str = "prompts file",
                   numbers: Sequence[int] | None = None) -> list[list[int]]:
    """Every text's token ids (with the tokenizer's special tokens, e.g. BOS); a text that tokenizes
    to nothing is a :class:`PromptError` naming it (``where``: the file; ``numbers``: the texts' 1-based
    numbers in it, default their positions)."""
    out: list[list[int]] = []
    for k, text in zip(numbers if numbers is not None else range(1, len(texts) + 1), texts):
        ids = [int(t) for t in tokenizer(text)["input_ids"]]
        if not ids:
            raise PromptError(f"{where}: text {k} ({text[:40]!r}) tokenizes to no tokens with the model's "
                              "tokenizer; expected texts the tokenizer encodes")
        out.append(ids)
    return out


def window_prompts(token_pool: Sequence[Sequence[int]], length: int, seed: int, n: int) -> list[list[int]]:
    """Run ``seed``'s ``n`` prompts from an already tokenized pool (:func:`pool_window`), each truncated to
    ``length`` tokens; shorter texts stay shorter."""
    if length < 1:
        raise ValueError(f"text prompts: need length >= 1, got {length}")
    return [list(token_pool[i][:length]) for i in pool_window(len(token_pool), seed, n)]


def text_prompts(
    texts: Sequence[str],
    tokenizer: Any,
    length: int,
    seed: int,
    n: int,
) -> list[list[int]]:
    """Run ``seed``'s ``n`` texts (:func:`pool_window`: no repeat within a run while ``n`` <= the pool,
    none across consecutive seeds until the pool is used up), tokenized (with the tokenizer's special tokens,
    e.g. BOS) and truncated to ``length`` tokens. Shorter texts stay shorter (the engine pads on the left);
    a text that tokenizes to nothing is a :class:`PromptError`."""
    if not texts:
        raise PromptError("text_prompts: no texts to sample from")
    if length < 1:
        raise ValueError(f"text_prompts: need length >= 1, got {length}")
    idx = pool_window(len(texts), seed, n)
    chosen = tokenize_texts([texts[i] for i in idx], tokenizer, "text prompts", [i + 1 for i in idx])
    return [ids[:length] for ids in chosen]
