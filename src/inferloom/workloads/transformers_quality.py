"""The transformers engine's quality probes: greedy continuations, the
log-probabilities its decoding path computed, and teacher-forced scoring.

What the quality contract (:mod:`inferloom.measure.quality`) calls through
:meth:`TransformersEngine.greedy`, :meth:`~TransformersEngine.greedy_logprobs`
and :meth:`~TransformersEngine.score`; each runs under the configuration's
torch state (:func:`~inferloom.workloads.transformers_generation.run_state`),
batched at its ``micro_batch``, with ``pad`` the tokenizer's padding id.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from inferloom.workloads.transformers_generation import (
    TokenCountError,
    TransformersHandle,
    batch_tensors,
    generate_tokens,
    run_state,
    static_loop,
)

__all__ = ["greedy", "greedy_logprobs", "score"]


def greedy(handle: TransformersHandle, prompts: list[list[int]], max_new_tokens: int, pad: int) -> list[list[int]]:
    """Greedy continuations through the configuration's generate() path
    (cache, compile, speculation), batched at its micro_batch."""
    micro = int(handle.config["micro_batch"])
    out: list[list[int]] = []
    with run_state(handle):
        for j in range(0, len(prompts), micro):
            ids, mask = batch_tensors(prompts[j:j + micro], pad, handle.device)
            new = generate_tokens(handle, ids, mask, max_new_tokens)
            out.extend(new.cpu().tolist())
    return out


def greedy_logprobs(
    handle: TransformersHandle, prompts: list[list[int]], max_new_tokens: int, pad: int
) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy continuations plus the log-probabilities the generate() path
    itself computed at each step (incremental decoding with its cache):
    float32 on CPU, [n, T, V]. Optional probe: the quality contract uses it
    on stock to measure the rounding noise between stock's two paths."""
    micro = int(handle.config["micro_batch"])
    conts: list[list[int]] = []
    chunks: list[torch.Tensor] = []
    with run_state(handle):
        for j in range(0, len(prompts), micro):
            ids, mask = batch_tensors(prompts[j:j + micro], pad, handle.device)
            if handle.config["decode_loop"] == "static_loop":
                new, rows = static_loop(handle, ids, mask, max_new_tokens, keep_logits=True)
                conts.extend(new.cpu().tolist())
                chunks.append(torch.log_softmax(torch.stack(rows, dim=1), dim=-1).cpu())
                continue
            out = handle.model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens, output_logits=True, return_dict_in_generate=True,
            )
            new = out.sequences[:, ids.shape[1]:]
            if new.shape[1] != max_new_tokens or len(out.logits) != max_new_tokens:
                raise TokenCountError(
                    f"generate() produced {new.shape[1]} tokens / {len(out.logits)} logit rows, expected {max_new_tokens}"
                )
            conts.extend(new.cpu().tolist())
            steps = torch.stack([step.float() for step in out.logits], dim=1)
            chunks.append(torch.log_softmax(steps, dim=-1).cpu())
            del out, steps
    return conts, torch.cat(chunks, dim=0)


def score(
    handle: TransformersHandle, prompts: list[list[int]], continuations: list[list[int]], pad: int
) -> torch.Tensor:
    """Teacher-forced log-probabilities, float32 on CPU, shape [n, T, V]:
    row t is the distribution predicting continuations[i][t]. One forward
    (no cache, uncompiled) over prompt + continuation per micro-batch, under
    the configuration's dtype, attention, SDPA backend and TF32 settings."""
    if len(prompts) != len(continuations):
        raise ValueError("score: prompts and continuations differ in length")
    lens = {len(c) for c in continuations}
    if len(lens) != 1 or 0 in lens:
        raise ValueError("score: all continuations must have the same non-zero length")
    T = lens.pop()
    micro = int(handle.config["micro_batch"])
    fwd = handle.eager_forward
    has_keep = "logits_to_keep" in inspect.signature(fwd).parameters
    chunks: list[torch.Tensor] = []
    with run_state(handle):
        for j in range(0, len(prompts), micro):
            seqs = [list(p) + list(c) for p, c in zip(prompts[j:j + micro], continuations[j:j + micro])]
            ids, mask = batch_tensors(seqs, pad, handle.device)
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "use_cache": False}
            if has_keep:
                kwargs["logits_to_keep"] = T + 1
            logits = fwd(**kwargs).logits
            logits = logits[:, -(T + 1):-1, :]
            chunks.append(torch.log_softmax(logits.float(), dim=-1).cpu())
            del logits
    return torch.cat(chunks, dim=0)
