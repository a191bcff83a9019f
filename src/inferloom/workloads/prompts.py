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

Chat prompts (``traffic.chat_template`` / ``quality.chat_template: true``): the file's lines are
``{"messages": [{"role": ..., "content": ...}, ...]}`` (:func:`load_jsonl_chats`), and each is rendered by
ONE function, every engine's (:func:`render_chats`): the tokenizer's own chat template with the
assistant's generation prompt (``apply_chat_template(messages, add_generation_prompt=True,
tokenize=False)``), the rendered text encoded *without* adding special tokens again (the template writes
its own), which is what vLLM's ``/v1/chat/completions`` builds (its ``add_special_tokens`` defaults to
false for chat requests; tests/test_chat_prompts.py compares the two on a real server). A file's lines
are all texts or all chats, as its flag says; a line of the other kind is refused naming it. A chat is a
whole request: a timed run never cuts one (a chat longer than ``traffic.input_len`` is refused:
``max_len``); a quality probe drawn from chats keeps their *last* ``length`` tokens (the end of the
conversation and the assistant's turn: :func:`window_prompts` ``keep="tail"``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from inferloom.errors import InferloomError

__all__ = ["PromptError", "random_prompts", "load_jsonl_texts", "pool_window", "pool_state", "tokenize_texts",
           "text_prompts", "window_prompts", "load_jsonl_chats", "load_prompt_file", "render_chats",
           "tokenize_prompts", "chat_template_of"]

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


def _jsonl_objects(path: str | Path, expected: str) -> Iterable[tuple[int, Any]]:
    """(line number, parsed object) of every non-blank line; a missing file or a line that is not JSON:
    :class:`PromptError`."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise PromptError(f"prompts file '{path}': not found; expected a JSONL file of {expected} lines")
    with p.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj: Any = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PromptError(f"prompts file '{path}': line {lineno} is not valid JSON ({exc.msg})") from None
            yield lineno, obj


def load_jsonl_texts(path: str | Path, chat_flag: str | None = None) -> list[str]:
    """The ``"text"`` field of every non-blank line of a JSONL file.

    Raises :class:`PromptError` naming the file (and line) when the file is
    missing, a line is not JSON, a line is not an object with a string
    ``"text"``, or no texts are found. A chat line (``"messages"``) is named as
    one; ``chat_flag``: the spec field that would render it (its refusal says to set it).
    """
    texts: list[str] = []
    for lineno, obj in _jsonl_objects(path, '{"text": ...}'):
        if isinstance(obj, dict) and "messages" in obj and "text" not in obj:
            hint = (f"set {chat_flag}: true to render chat lines with the model's chat template (then every line "
                    "is one)" if chat_flag else "this file takes texts only")
            raise PromptError(f"prompts file '{path}': line {lineno} is a chat ({{\"messages\": ...}}), not a "
                              f"{{\"text\": ...}} line; {hint}")
        if not isinstance(obj, dict) or "text" not in obj:
            raise PromptError(f"prompts file '{path}': line {lineno} has no \"text\" key; expected {{\"text\": ...}}")
        if not isinstance(obj["text"], str) or not obj["text"].strip():
            raise PromptError(f"prompts file '{path}': line {lineno}: \"text\" must be a non-empty string")
        texts.append(obj["text"])
    if not texts:
        raise PromptError(f"prompts file '{path}': no texts found; expected at least one {{\"text\": ...}} line")
    return texts


def load_jsonl_chats(path: str | Path, chat_flag: str = "traffic.chat_template") -> list[list[dict[str, str]]]:
    """The ``"messages"`` of every non-blank line of a JSONL file: each a non-empty list of
    ``{"role": str, "content": str}`` (the module docstring). A text line, or a malformed one: one
    :class:`PromptError` line naming the file and line (``chat_flag``: the field that asked for chats)."""
    chats: list[list[dict[str, str]]] = []
    for lineno, obj in _jsonl_objects(path, '{"messages": [...]}'):
        where = f"prompts file '{path}': line {lineno}"
        if isinstance(obj, dict) and "text" in obj and "messages" not in obj:
            raise PromptError(f"{where} is a text ({{\"text\": ...}}), not a chat line; with {chat_flag}: true "
                              "every line is {\"messages\": [{\"role\": ..., \"content\": ...}, ...]} (a file is all "
                              f"texts or all chats: set {chat_flag}: false for texts)")
        msgs = obj.get("messages") if isinstance(obj, dict) else None
        if not isinstance(msgs, list) or not msgs:
            raise PromptError(f"{where} has no \"messages\" list; expected {{\"messages\": [{{\"role\": \"user\", "
                              "\"content\": ...}, ...]}")
        for k, m in enumerate(msgs, start=1):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and m["role"].strip()
                    and isinstance(m.get("content"), str)):
                raise PromptError(f"{where}: message {k} is not {{\"role\": str, \"content\": str}}")
        chats.append([{"role": m["role"], "content": m["content"]} for m in msgs])
    if not chats:
        raise PromptError(f"prompts file '{path}': no chats found; expected at least one {{\"messages\": [...]}} line")
    return chats


def load_prompt_file(path: str | Path, chat: bool, chat_flag: str) -> list[Any]:
    """A prompts file's entries as its flag says: texts (:func:`load_jsonl_texts`) or chats
    (:func:`load_jsonl_chats`); ``chat_flag``: the spec field of that flag, named by a refusal."""
    return load_jsonl_chats(path, chat_flag) if chat else load_jsonl_texts(path, chat_flag)


def chat_template_of(tokenizer: Any) -> str | None:
    """The tokenizer's own chat template (None when it has none)."""
    tpl = getattr(tokenizer, "chat_template", None)
    if isinstance(tpl, dict):  # named templates: the default one
        tpl = tpl.get("default")
    return tpl if isinstance(tpl, str) and tpl.strip() else None


def render_chats(chats: Sequence[Sequence[dict[str, str]]], tokenizer: Any, where: str = "prompts file",
                 numbers: Sequence[int] | None = None, *, chat_flag: str = "traffic.chat_template",
                 max_len: int | None = None, max_field: str = "traffic.input_len") -> list[list[int]]:
    """Every chat's token ids as the model's chat template renders it, with the assistant's generation
    prompt; the rendered text is encoded without adding special tokens (the template writes its own):
    the ids vLLM's ``/v1/chat/completions`` builds. THE rendering of every engine (module docstring).
    A tokenizer without a chat template, a template that fails on a chat, a chat that renders to nothing
    or to more than ``max_len`` tokens (``max_field`` names the limit): one :class:`PromptError` line."""
    if chat_template_of(tokenizer) is None:
        raise PromptError(f"{where}: {chat_flag} is true but the model's tokenizer has no chat template (no "
                          "chat_template in tokenizer_config.json, no chat_template.jinja); use {\"text\": ...} "
                          f"lines with {chat_flag}: false, or a model with a chat template")
    out: list[list[int]] = []
    for k, msgs in zip(numbers if numbers is not None else range(1, len(chats) + 1), chats):
        try:
            text = tokenizer.apply_chat_template(list(msgs), add_generation_prompt=True, tokenize=False)
        except Exception as exc:  # noqa: BLE001 - a template that raises on this chat (roles, ...): one line
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise PromptError(f"{where}: chat {k}: the model's chat template refuses it ({type(exc).__name__}: "
                              f"{first[:200]})") from None
        ids = [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]
        if not ids:
            raise PromptError(f"{where}: chat {k} renders to no tokens with the model's chat template")
        if max_len is not None and len(ids) > max_len:
            raise PromptError(f"{where}: chat {k} renders to {len(ids)} tokens, above {max_field} ({max_len}); "
                              f"a chat is sent whole, never cut: raise {max_field} or shorten the chat")
        out.append(ids)
    return out


def tokenize_prompts(entries: Sequence[Any], tokenizer: Any, where: str, chat: bool, *,
                     chat_flag: str = "traffic.chat_template", max_len: int | None = None,
                     max_field: str = "traffic.input_len") -> list[list[int]]:
    """A loaded prompts file's token ids: chats rendered (:func:`render_chats`), texts tokenized
    (:func:`tokenize_texts`; ``max_len`` applies to chats only: texts are cut to the length)."""
    if chat:
        return render_chats(entries, tokenizer, where, chat_flag=chat_flag, max_len=max_len, max_field=max_field)
    return tokenize_texts(entries, tokenizer, where)


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


def window_prompts(token_pool: Sequence[Sequence[int]], length: int, seed: int, n: int,
                   keep: str = "head") -> list[list[int]]:
    """Run ``seed``'s ``n`` prompts from an already tokenized pool (:func:`pool_window`), each truncated to
    ``length`` tokens (texts: their first; ``keep="tail"``, chats: their last, the assistant's turn
    included); shorter ones stay shorter."""
    if length < 1:
        raise ValueError(f"text prompts: need length >= 1, got {length}")
    if keep not in ("head", "tail"):
        raise ValueError(f"window_prompts: keep is 'head' or 'tail', got {keep!r}")
    return [list(token_pool[i][:length] if keep == "head" else token_pool[i][-length:])
            for i in pool_window(len(token_pool), seed, n)]


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
