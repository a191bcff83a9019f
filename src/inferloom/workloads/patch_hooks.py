"""The optional adapter hook for engine source patches (``serving.engine_patches``), listed with the others in
:data:`inferloom.workloads.base.OPTIONAL_HOOKS`."""

from __future__ import annotations

from typing import Any, Mapping, Protocol, runtime_checkable

__all__ = ["EnginePatches"]


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
