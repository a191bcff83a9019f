"""The batched quality probes' optional adapter hook, beside the hooks in
:mod:`inferloom.workloads.base` (whose ``OPTIONAL_HOOKS`` lists it too)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["BatchedProbes"]


@runtime_checkable
class BatchedProbes(Protocol):
    """A server whose ``greedy`` and ``score`` send each prompt as its own
    request (``quality.concurrency`` in flight), so that the contract never
    depends on the batches its scheduling happens to form, and which can also
    send them all in one request: its batched paths.

    ``greedy_batched(handle, prompts, max_new_tokens)`` and
    ``score_batched(handle, prompts, continuations)``: ``greedy`` and ``score``
    with every prompt in one batch. :mod:`inferloom.measure.batched_quality`
    judges them against gross damage only (a broken batched path), since
    batch-composition noise is rounding-level. Without the hook, no batched
    guard runs."""

    def greedy_batched(self, handle: Any, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]: ...

    def score_batched(self, handle: Any, prompts: list[list[int]], continuations: list[list[int]]) -> Any: ...
