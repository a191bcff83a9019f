"""The optional adapter hooks for what a server engine runs beyond its flags, listed with the others in
:data:`inferloom.workloads.base.OPTIONAL_HOOKS`: engine source patches (``serving.engine_patches``), the
enablement ladder's source rungs, engine tables a KB recipe keeps (tuned fused-MoE configs), and server starts
bounded by a session's budget."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, runtime_checkable

__all__ = ["EnginePatches", "SourceRungs", "EngineTables", "BudgetedStarts"]


@runtime_checkable
class BudgetedStarts(Protocol):
    """An adapter whose configurations start servers, and which bounds each start by ``start_budget()``: the
    seconds a session has left (None: unbounded; ``workloads.server_start.budgeted_timeout``). A session sets it
    for a trial's measurement and clears it after; a start the budget cuts fails with kind ``budget``, not a
    verdict on the configuration. Without it, a start waits ``serving.startup_timeout_s`` whatever is left."""

    start_budget: Callable[[], float | None] | None


@runtime_checkable
class EnginePatches(Protocol):
    """An engine that takes the user's source patches (``serving.engine_patches``) through an isolated copy of
    its installed package (vLLM: ``vllm_engine_patches``). ``engine_patch_knob``: the knob whose value names the
    patch a server starts with (``phase: PATCH``); ``engine_patch_policy()``: the patch policy
    (:class:`~inferloom.patches.policy.PatchPolicy`: only the package's files may change);
    ``engine_patch_overlay(name)``: the isolated copy built for patch ``name`` (its record, as the server start
    will record it), raising :class:`~inferloom.patches.parse.PatchRefusal` with the rule when it can't be
    (``does_not_apply`` on the installed version). The installed environment is never written."""

    engine_patch_knob: str

    def engine_patch_policy(self) -> Any: ...

    def engine_patch_overlay(self, name: str) -> Mapping[str, Any]: ...


@runtime_checkable
class SourceRungs(Protocol):
    """ENABLEMENT rungs 3-5 (docs/enablement.md). ``source_rungs(rung)``: ``(candidates, why none)``: rung 3's in-tree
    engine patches, rung 4's alternate engine environments or rung 5's upstream diffs, each ``{"name", "change"
    (knobs over stock), "what"}``; ``rung_stack(config)``: what its server runs beyond its flags (overlay, python)."""

    def source_rungs(self, rung: int) -> tuple[list[dict[str, Any]], str]: ...

    def rung_stack(self, config: Mapping[str, Any]) -> dict[str, Any]: ...


@runtime_checkable
class EngineTables(Protocol):
    """An adapter whose configurations hand the engine tables it built for this workload and device (vLLM's
    tuned fused-MoE configs: ``moe_configs=tuned``), which a KB recipe keeps with its winner (the tables'
    content, ``winner.evidence.engine_tables``: knob -> tables). ``replay_tables(tables)``: a later session's
    warm replay gives them back, and the next servers use them instead of building them again."""

    def replay_tables(self, tables: Mapping[str, Any]) -> None: ...
