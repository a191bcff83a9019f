"""Quality probes through a running SGLang server's native ``/generate`` API.

* :func:`greedy_continuations`: ``{"input_ids": p, "sampling_params": {"max_new_tokens": n,
  "min_new_tokens": n, "ignore_eos": true, "temperature": 0}}``; the server's ``output_ids``.
* :func:`score_logprobs`: ``return_logprob`` with ``logprob_start_len`` = the prompt's length less one and
  ``top_logprobs_num`` = :data:`~inferloom.workloads.sglang_launch.TOP_K`: ``meta_info.input_top_logprobs``
  (per position, ``[logprob, token_id, text]`` of the top k) and ``meta_info.input_token_logprobs`` (the
  scored token's own) rebuilt into full rows (``logprob_rows.topk_rows``). Entry ``j`` is the distribution
  of the token at ``logprob_start_len + j``, and entry 0 is always None (SGLang 0.5.17,
  ``logprob_result_processor``: ``[None] + logprobs[:-1]``: the logits before the start are not computed),
  hence the start one before the first scored token. Each answer's token ids are checked against the
  sequence sent and a missing entry is an error, so a server that counts positions otherwise is never a
  silent shift.

How the prompts are issued (``concurrency``, as for vLLM): an int sends one request per prompt with at most
that many in flight (1: each prompt alone); ``None`` sends all prompts in one request (a batch of
``input_ids``). SGLang has no per-request cache salt: its radix cache is flushed (``/flush_cache``) before
each probe, so no probe reads another's cached prefix (the scored sequences start with the greedy probe's
prompts).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Callable, Sequence

from inferloom.workloads.base import AdapterError
from inferloom.workloads.logprob_rows import each_prompt, topk_rows
from inferloom.workloads.sglang_launch import TOP_K

__all__ = ["SCORE_APPROXIMATION", "post_json", "flush_cache", "issue", "greedy_continuations", "score_logprobs",
           "score_rows"]

SCORE_APPROXIMATION = (
    f"server prompt log-probabilities (SGLang input_top_logprobs), top-{TOP_K} per position plus the scored "
    "token; the remaining probability mass is spread uniformly over the other tokens. top1_agreement is exact "
    "whenever the argmax is in the top-k; mean_kl is approximate (the tail is coarse-grained)")


def post_json(base_url: str, server_id: str, path: str, body: dict[str, Any] | None, timeout_s: float) -> Any:
    """POST ``body`` to ``path``; an HTTP error is an :class:`AdapterError`."""
    req = urllib.request.Request(base_url + path, data=json.dumps(body or {}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            raw = r.read()
    except urllib.error.HTTPError as exc:
        raise AdapterError(f"server {server_id}: HTTP {exc.code} on {path}: {exc.read()[:500]!r}", kind="error") from None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def flush_cache(base_url: str, server_id: str, timeout_s: float) -> None:
    """Empty the server's radix (prefix) cache; it refuses while requests run (an error: a probe runs alone)."""
    post_json(base_url, server_id, "/flush_cache", None, timeout_s)


def issue(body: dict[str, Any], prompts: Sequence[Sequence[int]], concurrency: int | None,
          post: Callable[[dict[str, Any]], Any]) -> list[dict[str, Any]]:
    """``post`` ``body`` for ``prompts``: one answer per prompt, in prompt order."""
    if concurrency is None:
        out = post({**body, "input_ids": [list(p) for p in prompts]})
        if not isinstance(out, list) or len(out) != len(prompts):
            raise AdapterError(f"server answered {len(out) if isinstance(out, list) else 'no list'} for "
                               f"{len(prompts)} prompts", kind="error")
        return out

    def one(p: Sequence[int]) -> dict[str, Any]:
        out = post({**body, "input_ids": list(p)})
        return out[0] if isinstance(out, list) else out

    return each_prompt(one, prompts, concurrency)


def greedy_continuations(base_url: str, server_id: str, prompts: list[list[int]], max_new_tokens: int,
                         timeout_s: float, concurrency: int | None = None) -> list[list[int]]:
    """Greedy continuations through the server's generation path; token ids from the server."""
    flush_cache(base_url, server_id, timeout_s)
    body = {"sampling_params": {"max_new_tokens": max_new_tokens, "min_new_tokens": max_new_tokens,
                                "ignore_eos": True, "temperature": 0.0}}
    answers = issue(body, prompts, concurrency, lambda b: post_json(base_url, server_id, "/generate", b, timeout_s))
    conts: list[list[int]] = []
    for a in answers:
        ids = a.get("output_ids") if isinstance(a, dict) else None
        if ids is None:
            raise AdapterError("server returned no output_ids", kind="unsupported")
        conts.append([int(x) for x in ids])
    if any(len(c) != max_new_tokens for c in conts):
        raise AdapterError(f"greedy: expected {max_new_tokens} tokens per prompt, got {[len(c) for c in conts]}",
                           kind="token_count")
    return conts


def score_rows(answer: dict[str, Any], seq: Sequence[int], start: int, T: int) -> list[dict[int, float]]:
    """``T`` ``{token id: logprob}`` entries for positions ``start .. start+T-1`` of ``seq`` from one
    ``/generate`` answer asked with ``logprob_start_len = start - 1`` (see the module docstring);
    AdapterError when it lacks them or is misaligned."""
    meta = (answer.get("meta_info") or {}) if isinstance(answer, dict) else {}
    top, own = meta.get("input_top_logprobs"), meta.get("input_token_logprobs")
    if top is None or own is None:
        raise AdapterError("server returned no input_top_logprobs / input_token_logprobs", kind="unsupported")
    if len(own) < T + 1 or len(top) < T + 1:
        raise AdapterError(f"server returned {len(own)} prompt log-probabilities for {T} positions (and the "
                           "one before)", kind="error")
    rows: list[dict[int, float]] = []
    for j in range(1, T + 1):
        pos = start - 1 + j
        lp, tid = own[j][0], int(own[j][1])
        if tid != int(seq[pos]):
            raise AdapterError(f"prompt log-probability {j} is for token {tid}, the sequence has {seq[pos]} "
                               f"at position {pos}", kind="error")
        if lp is None or not top[j]:
            raise AdapterError(f"server returned no log-probabilities at position {pos}", kind="error")
        entry = {int(t[1]): float(t[0]) for t in top[j] if t[0] is not None}
        entry[tid] = float(lp)
        rows.append(entry)
    return rows


def score_logprobs(base_url: str, server_id: str, prompts: list[list[int]], continuations: list[list[int]],
                   vocab_size: int, timeout_s: float, concurrency: int | None = None) -> Any:
    """A ``(len(prompts), T, vocab_size)`` float32 tensor of log-probabilities at each continuation position."""
    if len(prompts) != len(continuations):
        raise ValueError("score: prompts and continuations differ in length")
    T = len(continuations[0])
    if T == 0 or any(len(c) != T for c in continuations):
        raise ValueError("score: all continuations must have the same non-zero length")
    if any(not p for p in prompts):
        raise ValueError("score: every prompt needs at least one token")
    flush_cache(base_url, server_id, timeout_s)
    seqs = [list(p) + list(c) for p, c in zip(prompts, continuations)]

    def post(b: dict[str, Any]) -> Any:
        return post_json(base_url, server_id, "/generate", b, timeout_s)

    base = {"sampling_params": {"max_new_tokens": 1, "temperature": 0.0}, "return_logprob": True,
            "top_logprobs_num": TOP_K}
    if concurrency is None and len({len(p) for p in prompts}) == 1:
        answers = issue({**base, "logprob_start_len": len(prompts[0]) - 1}, seqs, None, post)
    else:  # one request per prompt: each its own logprob_start_len
        def one(i: int) -> dict[str, Any]:
            return issue({**base, "logprob_start_len": len(prompts[i]) - 1}, [seqs[i]], 1, post)[0]
        answers = each_prompt(one, range(len(seqs)), 1 if concurrency is None else concurrency)
    return topk_rows([score_rows(a, seqs[i], len(prompts[i]), T) for i, a in enumerate(answers)], vocab_size)
