"""Quality probes through a running vLLM server's ``/v1/completions``.

* :func:`greedy_continuations`: greedy continuations through the server's own
  generation path (its batching, cache, speculation), token ids from the
  server.
* :func:`score_logprobs`: per-position log-probabilities rebuilt from the
  server's top-k prompt log-probabilities (see :data:`SCORE_APPROXIMATION`).
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from typing import Any

from inferloom.workloads.base import AdapterError
from inferloom.workloads.vllm_launch import SERVED_NAME, TOP_K

__all__ = ["SCORE_APPROXIMATION", "post_completions", "greedy_continuations", "score_logprobs"]

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


def greedy_continuations(base_url: str, server_id: str, prompts: list[list[int]], max_new_tokens: int,
                         timeout_s: float) -> list[list[int]]:
    """Greedy continuations through the server (its batching, cache,
    speculation), all prompts in one request; token ids from the server."""
    out = post_completions(base_url, server_id, {
        "model": SERVED_NAME, "prompt": [list(p) for p in prompts], "max_tokens": max_new_tokens,
        "min_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0.0, "return_token_ids": True}, timeout_s)
    conts: list[list[int] | None] = [None] * len(prompts)
    for ch in out["choices"]:
        ids = ch.get("token_ids")
        if ids is None:
            raise AdapterError("server returned no token_ids (return_token_ids unsupported)", kind="unsupported")
        conts[int(ch["index"])] = [int(x) for x in ids]
    if any(c is None or len(c) != max_new_tokens for c in conts):
        raise AdapterError(f"greedy: expected {max_new_tokens} tokens per prompt, got "
                           f"{[None if c is None else len(c) for c in conts]}", kind="token_count")
    return [list(c) for c in conts if c is not None]


def score_logprobs(base_url: str, server_id: str, prompts: list[list[int]], continuations: list[list[int]],
                   vocab_size: int, timeout_s: float) -> Any:
    """A ``(len(prompts), T, vocab_size)`` float32 tensor of log-probabilities
    at each continuation position, from the server's top-k prompt
    log-probabilities (the rest of the mass spread uniformly)."""
    import torch  # optional dependency: only a quality probe needs it

    if len(prompts) != len(continuations):
        raise ValueError("score: prompts and continuations differ in length")
    T = len(continuations[0])
    if T == 0 or any(len(c) != T for c in continuations):
        raise ValueError("score: all continuations must have the same non-zero length")
    V = vocab_size
    seqs = [list(p) + list(c) for p, c in zip(prompts, continuations)]
    out = post_completions(base_url, server_id, {"model": SERVED_NAME, "prompt": seqs, "max_tokens": 1,
                                                 "temperature": 0.0, "prompt_logprobs": TOP_K}, timeout_s)
    res = torch.empty(len(seqs), T, V, dtype=torch.float32)
    for ch in out["choices"]:
        i = int(ch["index"])
        plp = ch.get("prompt_logprobs")
        if plp is None:
            raise AdapterError("server returned no prompt_logprobs", kind="unsupported")
        start = len(prompts[i])
        for t in range(T):
            entry = plp[start + t] or {}
            ids = torch.tensor([int(k) for k in entry], dtype=torch.long)
            lps = torch.tensor([float(v["logprob"] if isinstance(v, dict) else v) for v in entry.values()],
                               dtype=torch.float64)
            lps = torch.nan_to_num(lps, neginf=-1e4)
            mass = float(lps.exp().sum().clamp(max=1.0))
            rest = V - len(ids)
            fill = math.log(max(1.0 - mass, 1e-12) / rest) if rest > 0 else -1e4
            row = torch.full((V,), fill, dtype=torch.float64)
            if len(ids):
                row[ids] = lps
            res[i, t] = torch.log_softmax(row, dim=-1).float()
    return res
