"""What differs between workloads, chosen once from the spec.

* :class:`ConfigStrategy`: a workload whose stack is a configuration (the
  transformers engine, vLLM, the synthetic adapter): FRAMEWORK is the
  configuration search, CLOSE measures the final stack against stock and its
  roofline, SWEEP runs its traffic grid.
* :class:`CustomStrategy`: a custom workload (``framework: custom``), whose
  stack also holds source patches: the workspace is bound at start, FRAMEWORK
  tries source patches first, CLOSE measures in the stock and stack trees and
  runs the rollback drill, and there is no traffic grid to sweep.
* :class:`EnginePatchStrategy`: a configuration workload with engine source patches
  (``serving.engine_patches``): FRAMEWORK tries the patches first (each through the patch gates, then measured
  like any change: :mod:`inferloom.phases.framework_patches`), then the configuration search; CLOSE adds the
  rollback drill when a patch is kept (:mod:`inferloom.phases.close_engine`).
* :class:`ImageStrategy`: an image workload (``framework: diffusers``): a
  configuration like the first, whose shape (resolution, steps, batch) its
  spec fixes, so there is no traffic grid to sweep either.

This module is the coordinator's wiring, not a phase: it composes the phase
steps each workload runs (a custom workload's patch step hands over to the
configuration search it is given here; the configuration search runs behind
the coordinator's budget split, :mod:`inferloom.phases.budget`), so no phase
module imports another (``tests/test_phase_peers.py``). The coordinator picks
the strategy; phases reach it only as ``ctx.strategy``.
"""

from __future__ import annotations

from typing import Any

from inferloom.frameworks import framework
from inferloom.phases.budget import leave_kernel_share
from inferloom.phases.close import final_compare
from inferloom.phases.close_engine import engine_close
from inferloom.phases.context import SessionContext, Step, WorkloadStrategy
from inferloom.phases.custom import patch_framework_step
from inferloom.phases.custom_close import custom_close
from inferloom.phases.custom_workspace import bind_session
from inferloom.phases.framework import framework_step
from inferloom.phases.framework_patches import engine_patch_step
from inferloom.session.state import SessionState

__all__ = ["ConfigStrategy", "CustomStrategy", "ImageStrategy", "EnginePatchStrategy", "strategy_for", "config_search"]

#: FRAMEWORK's configuration search, behind the coordinator's budget split (KERNEL's share kept for it)
config_search: Step = leave_kernel_share(framework_step)


class ConfigStrategy:
    """A workload whose stack is a configuration."""

    name = "configuration"
    sweep_skip_reason: str | None = None

    def bind(self, ctx: SessionContext) -> None:
        return None

    def framework_step(self, ctx: SessionContext, st: SessionState) -> None:
        config_search(ctx, st)

    def close_measure(self, ctx: SessionContext, st: SessionState) -> None:
        final_compare(ctx, st)


class CustomStrategy:
    """A custom workload: source patches, then configuration; the rollback drill at CLOSE."""

    name = "custom"
    sweep_skip_reason: str | None = "a custom workload has no traffic grid"

    def bind(self, ctx: SessionContext) -> None:
        bind_session(ctx)  # the workspace and the stock / stack source trees (issue 6)

    def framework_step(self, ctx: SessionContext, st: SessionState) -> None:
        patch_framework_step(ctx, st, config_search)  # source patches first, then the configuration search

    def close_measure(self, ctx: SessionContext, st: SessionState) -> None:
        custom_close(ctx, st)  # final comparison in the stock and stack trees, then the rollback drill


class EnginePatchStrategy(ConfigStrategy):
    """A configuration workload with engine source patches: the patches first, then the configuration search;
    the rollback drill at CLOSE."""

    name = "engine-patches"

    def framework_step(self, ctx: SessionContext, st: SessionState) -> None:
        engine_patch_step(ctx, st, config_search)

    def close_measure(self, ctx: SessionContext, st: SessionState) -> None:
        engine_close(ctx, st)


class ImageStrategy(ConfigStrategy):
    """An image workload: a configuration search; no traffic grid."""

    name = "image"
    sweep_skip_reason: str | None = ("an image workload's shape (resolution, steps, batch) is fixed by its spec: "
                                     "no traffic grid")


def strategy_for(spec: Any) -> WorkloadStrategy:
    """The strategy for ``spec``'s workload."""
    kind = framework(spec.framework).strategy
    if kind == "custom":
        return CustomStrategy()
    if kind == "image":
        return ImageStrategy()
    return EnginePatchStrategy() if spec.serving.engine_patches else ConfigStrategy()
