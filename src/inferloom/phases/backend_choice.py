"""Which kernel backend a session's KERNEL phase runs, and why (or why it is skipped): asked by the KERNEL
phase itself, by the coordinator's budget split (no backend, no share kept for KERNEL) and by PRELUDE (a
server's own profile is taken only when that phase will use it: ``phases/server_profile.py``)."""

from __future__ import annotations

from typing import Any

from inferloom.frameworks import framework
from inferloom.kernels.base import workload_of
from inferloom.kernels.registry import resolve_backend
from inferloom.phases.context import SessionContext
from inferloom.session.state import SessionState
from inferloom.workloads import registry as _engines

__all__ = ["kernel_backend"]


def kernel_backend(ctx: SessionContext, st: SessionState) -> tuple[Any, str]:
    """The backend this session's KERNEL phase runs and why, or (None, why it is skipped): the one given to
    the coordinator, else ``spec.kernels.backend`` resolved for the workload (the coordinator's budget split,
    phases/budget.py, asks it too: no backend, no share kept for KERNEL)."""
    given = ctx.options.kernel_backend
    if given is not None:
        return given, f"backend {given.name} (given to the coordinator)"
    work = workload_of(ctx.spec, st.device, st.stack)
    fw = framework(ctx.spec.framework)
    # the engine's own backend (a server's plugin overlay) is opt-in: it keeps kernels.budget_share of the session
    own = _engines.kernel_backend(fw) if ctx.spec.kernels.backend == "plugin" else None
    if ctx.spec.kernels.backend == "plugin" and own is None:
        return None, f"backend plugin: the {fw.name} engine takes no kernel plugins"
    if own is not None:  # the engine delivers kernels itself (a server's plugin overlay)
        mine = set(own.knobs())  # its candidates switch only these: none measurable, no phase (and no budget kept)
        free = mine & {k.name for k in ctx.knobs} - set(ctx.spec.pinned)
        why = None if free else (f"its knobs ({', '.join(sorted(mine))}) are pinned by the spec or not in the "
                                 "adapter's knob space")
        why = why or own.unavailable(work)
        return (None, f"backend {own.name}: {why}") if why else (own, f"backend {own.name} (the {fw.name} engine's own)")
    return resolve_backend(ctx.spec.kernels.backend, work)
