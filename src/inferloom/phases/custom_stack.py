"""A custom session's source stack: what every custom_* module reads of it.

The stack of a custom session is its configuration plus the commits kept so
far; ``state.extra.source`` (:class:`~inferloom.session.state_models.SourceState`)
records it (see :mod:`inferloom.phases.custom`), the workspace holds its
trees, and each patch's outcome is a ``patch`` ledger entry."""

from __future__ import annotations

from inferloom.patches.worktree import Workspace
from inferloom.phases.context import SessionContext
from inferloom.session.state import SessionState
from inferloom.session.state_models import SourceState
from inferloom.workloads.base import AdapterError, SourceTrees

__all__ = ["PATCH", "source_trees", "source_state", "workspace"]

PATCH = "patch"  # ledger kind: one patch's outcome (gate reached, rule, commit)


def source_trees(ctx: SessionContext) -> SourceTrees:
    """The adapter as a source-tree workload (a custom workload's adapter always is one)."""
    if not isinstance(ctx.adapter, SourceTrees):
        raise TypeError(f"a custom workload needs an adapter with source trees (default_tree, results_dir); "
                        f"got {type(ctx.adapter).__name__}")
    return ctx.adapter


def source_state(st: SessionState) -> SourceState:
    """The session's source stack (:func:`~inferloom.phases.custom_workspace.bind_session` records it first)."""
    if st.extra.source is None:
        raise AdapterError("a custom workload's state.json has no source stack (extra.source): it was edited or "
                           "written by a different inferloom; start a new session", kind="workspace")
    return st.extra.source


def workspace(ctx: SessionContext, st: SessionState) -> Workspace:
    """The session's workspace: the clone and its trees (``stock``, ``stack``, ``candidate``, ``rollback``)."""
    return Workspace(ctx.dir / "workspace", ctx.spec.custom.repo, date=source_state(st).date)

