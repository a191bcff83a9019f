"""The quality contract's optional adapter hooks (the batched probes, the A/A
quality floor), beside the hooks in :mod:`inferloom.workloads.base` (whose
``OPTIONAL_HOOKS`` lists them too)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["BatchedProbes", "AAQuality"]


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


@runtime_checkable
class AAQuality(Protocol):
    """An adapter whose outputs vary between identical instances (a server's
    batch-dependent kernels): PRELUDE's A/A (stock-2 against stock) also
    measures the quality contract on the prompt sets ``aa_quality_sets`` names
    (e.g. ``("eval", "heldout")``), and that A/A disagreement is every later
    candidate's quality floor (:mod:`inferloom.measure.quality_floor`).
    Without the hook the A/A measures speed only (an engine whose outputs
    don't vary between instances has no floor to learn)."""

    aa_quality_sets: tuple[str, ...]
