"""Quality probes through a running vLLM server's ``/v1/completions``.

* :func:`greedy_continuations`: greedy continuations through the server's own
  generation path (its batching, cache, speculation), token ids from the
  server.
* :func:`score_logprobs`: per-position log-probabilities rebuilt from the
  server's top-k prompt log-probabilities (see :data:`SCORE_APPROXIMATION`).

How the prompts are issued (``concurrency``): an int sends one request per
prompt with at most that many in flight; at 1 each prompt is computed alone
(prefill of that prompt, then decode at batch 1), so every server forms the
same batches whatever its scheduling's timing (``async_scheduling`` failed the
contract on an H200 at top-1 0.973 when all prompts went in one request:
docs/quality.md, "Batch composition"). ``None`` sends all prompts in one
request: one wave, batched as the server's timing has it (the batched guard,
``measure/batched_quality.py``). Every request carries a fresh ``cache_salt``:
a prompt the server saw before is computed again in full, never partly read
from its prefix cache (another batch shape).
"""

from __future__ import annotations

import json
import uuid
import urllib.error
import urllib.request
from typing import Any, Callable, Sequence

from inferloom.workloads.base import AdapterError
from inferloom.workloads.logprob_rows import each_prompt, topk_rows
from inferloom.workloads.vllm_launch import SERVED_NAME, TOP_K

__all__ = ["SCORE_APPROXIMATION", "post_completions", "issue", "greedy_continuations", "score_logprobs"]

SCORE_APPROXIMATION = (
    f"server prompt log-probabilities, top-{TOP_K} per position plus the scored token; the remaining "
    "probability mass is spread uniformly over the other tokens. top1_agreement is exact whenever the "
    "argmax is in the top-k (always, for its own distribution); mean_kl is approximate (the tail is "
    "coarse-grained, which can under-state KL)")


def post_completions(base_url: str, server_id: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """POST ``body`` to the server's ``/v1/completions``; an HTTP error is an :class:`AdapterError`."""
    req = urllib.request.Request(base_url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        raise AdapterError(f"server {server_id}: HTTP {exc.code}: {exc.read()[:500]!r}", kind="error") from None


def issue(body: dict[str, Any], prompts: Sequence[Sequence[int]], concurrency: int | None,
          post: Callable[[dict[str, Any]], dict[str, Any]]) -> list[dict[str, Any]]:
    """``post`` ``body`` for ``prompts``: the choices in prompt order. ``concurrency`` None: one request
    with every prompt; an int: one request per prompt, at most that many in flight (1: one at a time)."""
    salt = f"inferloom-quality-{uuid.uuid4().hex}"  # never a prefix-cache hit on an earlier probe's blocks
    if concurrency is None:
        out = post({**body, "prompt": [list(p) for p in prompts], "cache_salt": salt})
        chs: list[dict[str, Any] | None] = [None] * len(prompts)
        for ch in out["choices"]:
            chs[int(ch["index"])] = ch
        if any(c is None for c in chs):
            raise AdapterError(f"server answered {len(out['choices'])} choices for {len(prompts)} prompts", kind="error")
        return [c for c in chs if c is not None]

    def one(p: Sequence[int]) -> dict[str, Any]:
        return post({**body, "prompt": [list(p)], "cache_salt": salt})["choices"][0]

    return each_prompt(one, prompts, concurrency)


def greedy_continuations(base_url: str, server_id: str, prompts: list[list[int]], max_new_tokens: int,
                         timeout_s: float, concurrency: int | None = None) -> list[list[int]]:
    """Greedy continuations through the server (its batching, cache,
    speculation), token ids from the server; ``concurrency``: see :func:`issue`."""
    body = {"model": SERVED_NAME, "max_tokens": max_new_tokens, "min_tokens": max_new_tokens, "ignore_eos": True,
            "temperature": 0.0, "return_token_ids": True}
    choices = issue(body, prompts, concurrency, lambda b: post_completions(base_url, server_id, b, timeout_s))
    conts: list[list[int]] = []
    for ch in choices:
        ids = ch.get("token_ids")
        if ids is None:
            raise AdapterError("server returned no token_ids (return_token_ids unsupported)", kind="unsupported")
        conts.append([int(x) for x in ids])
    if any(len(c) != max_new_tokens for c in conts):
        raise AdapterError(f"greedy: expected {max_new_tokens} tokens per prompt, got {[len(c) for c in conts]}",
                           kind="token_count")
    return conts


def score_logprobs(base_url: str, server_id: str, prompts: list[list[int]], continuations: list[list[int]],
                   vocab_size: int, timeout_s: float, concurrency: int | None = None) -> Any:
    """A ``(len(prompts), T, vocab_size)`` float32 tensor of log-probabilities
    at each continuation position, from the server's top-k prompt
    log-probabilities (the rest of the mass spread uniformly); ``concurrency``: see :func:`issue`."""
    if len(prompts) != len(continuations):
        raise ValueError("score: prompts and continuations differ in length")
    T = len(continuations[0])
    if T == 0 or any(len(c) != T for c in continuations):
        raise ValueError("score: all continuations must have the same non-zero length")
    V = vocab_size
    seqs = [list(p) + list(c) for p, c in zip(prompts, continuations)]
    choices = issue({"model": SERVED_NAME, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": TOP_K}, seqs,
                    concurrency, lambda b: post_completions(base_url, server_id, b, timeout_s))
    rows = []
    for i, ch in enumerate(choices):
        plp = ch.get("prompt_logprobs")
        if plp is None:
            raise AdapterError("server returned no prompt_logprobs", kind="unsupported")
        start = len(prompts[i])
        rows.append([{int(k): float(v["logprob"] if isinstance(v, dict) else v) for k, v in (plp[start + t] or {}).items()}
                     for t in range(T)])
    return topk_rows(rows, V)
