"""The transformers engine's generation loop: one prepared configuration's
handle, the torch state around a call, left-padded batches and one decoding
call (``generate()`` or :mod:`inferloom.workloads.static_loop`).

Global torch state a configuration changes (thread count, TF32, the SDPA
backend) is applied by :func:`run_state` around each call and restored
afterwards, so configurations never leak into each other.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from inferloom.errors import EXIT_RUN_FAILED, InferloomError
from inferloom.workloads.static_loop import greedy_static

__all__ = ["TransformersHandle", "TokenCountError", "error_kind", "run_state", "sync", "batch_tensors",
           "static_loop", "generate_tokens"]


@dataclass
class TransformersHandle:
    """One prepared configuration. ``id`` is unique per prepare; ``config_id``
    is the configuration's stable key (what :class:`RunRecord` carries)."""

    id: str
    config: dict[str, Any]
    config_id: str
    model: Any
    device: str
    dtype: torch.dtype
    eager_forward: Any  # the uncompiled forward, used by score()
    prepare_s: float = 0.0
    released: bool = False
    notes: dict[str, Any] = field(default_factory=dict)
    step: Any = None  # decode_loop=static_loop: the decode step's forward (compiled or not)
    caches: dict[tuple[int, int], Any] = field(default_factory=dict)  # static_loop's StaticCache per (batch, length)


class TokenCountError(InferloomError, RuntimeError):
    """A decoding call produced another number of tokens than asked for. run() records it as a failed run
    (kind token_count), a quality probe's caller as a failed contract; it never reaches the user as an error
    of its own (exit 1, the run failed, if one ever escaped)."""

    exit_code = EXIT_RUN_FAILED


def error_kind(exc: BaseException) -> str:
    """The failure kind a run records: ``oom``, ``compile``, ``token_count`` or ``error``."""
    oom_types = tuple(
        t
        for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None))
        if isinstance(t, type)
    )
    if oom_types and isinstance(exc, oom_types):
        return "oom"
    text = str(exc).lower()
    if "out of memory" in text:
        return "oom"
    mod = type(exc).__module__ or ""
    if mod.startswith("torch._dynamo") or mod.startswith("torch._inductor") or "backendcompilerfailed" in text:
        return "compile"
    if isinstance(exc, TokenCountError):
        return "token_count"
    return "error"


def _get_tf32() -> bool:
    """CUDA float32-matmul TF32 state. The legacy ``allow_tf32`` flag is used
    (all torch versions have it); torch >= 2.9 may refuse to read it after the
    new ``fp32_precision`` API was used, then that API is read instead."""
    m = torch.backends.cuda.matmul
    try:
        return bool(m.allow_tf32)
    except RuntimeError:
        return getattr(m, "fp32_precision", "ieee") == "tf32"


def _set_tf32(on: bool) -> None:
    m = torch.backends.cuda.matmul
    try:
        m.allow_tf32 = on
    except RuntimeError:  # pragma: no cover - only after the new API was used elsewhere
        m.fp32_precision = "tf32" if on else "ieee"


@contextlib.contextmanager
def run_state(handle: TransformersHandle) -> Iterator[None]:
    """The configuration's torch state (threads on CPU, TF32 on CUDA, SDPA
    backend, no_grad) for the duration of the block, restored afterwards."""
    cfg = handle.config
    prev_threads = torch.get_num_threads()
    prev_tf32: bool | None = None
    with contextlib.ExitStack() as stack:
        try:
            if handle.device == "cpu":
                torch.set_num_threads(int(cfg["cpu_threads"]))
            else:
                prev_tf32 = _get_tf32()
                _set_tf32(bool(cfg["tf32_matmul"]))
            if cfg["sdpa_backend"] != "auto":
                from torch.nn.attention import SDPBackend, sdpa_kernel

                backend = {
                    "math": SDPBackend.MATH,
                    "flash": SDPBackend.FLASH_ATTENTION,
                    "efficient": SDPBackend.EFFICIENT_ATTENTION,
                    "cudnn": SDPBackend.CUDNN_ATTENTION,
                }[cfg["sdpa_backend"]]
                stack.enter_context(sdpa_kernel(backend))
            stack.enter_context(torch.no_grad())
            yield
        finally:
            if torch.get_num_threads() != prev_threads:
                torch.set_num_threads(prev_threads)
            if prev_tf32 is not None:
                _set_tf32(prev_tf32)


def sync(device: str) -> None:
    """Wait for the device's queued work (CUDA); nothing on a CPU."""
    if device == "cuda":
        torch.cuda.synchronize()


def batch_tensors(prompts: list[list[int]], pad: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded input ids and attention mask on the device."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def static_loop(handle: TransformersHandle, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int,
                keep_logits: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """decode_loop=static_loop: prefill with the uncompiled forward, decode with the handle's step."""
    return greedy_static(handle.model, handle.eager_forward, handle.step or handle.eager_forward, ids, mask,
                         new_tokens, handle.caches, keep_logits=keep_logits)


def generate_tokens(handle: TransformersHandle, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """One generate() call; returns the new tokens [b, new_tokens] (still on
    the device). Raises TokenCountError if the count is not exact."""
    if handle.config["decode_loop"] == "static_loop":
        return static_loop(handle, ids, mask, new_tokens)[0]
    kwargs: dict[str, Any] = {
        "max_new_tokens": new_tokens,
        "min_new_tokens": new_tokens,
    }
    if handle.config["prompt_lookup"] > 0:
        kwargs["prompt_lookup_num_tokens"] = int(handle.config["prompt_lookup"])
    out = handle.model.generate(input_ids=ids, attention_mask=mask, **kwargs)
    if not isinstance(out, torch.Tensor):  # a GenerateOutput
        out = out.sequences
    produced = out.shape[1] - ids.shape[1]
    if produced != new_tokens or out.shape[0] != ids.shape[0]:
        raise TokenCountError(
            f"generate() produced {produced} new tokens for a batch of {ids.shape[0]}, expected {new_tokens}"
        )
    return out[:, ids.shape[1]:]
