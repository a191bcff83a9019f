"""The budget split between phases: the coordinator's, not a phase's.

A session has one budget (minutes, trials). The coordinator stops the search
when all of it is used (:meth:`~inferloom.phases.context.SessionContext.budget_reason`,
asked by its run loop); this module is how it shares the budget out between
phases: FRAMEWORK's configuration search ends once it has used its part,
leaving ``spec.kernels.budget_share`` to the KERNEL phase
(:func:`kernel_reserve`). :func:`leave_kernel_share` puts the split in front
of the configuration search; :mod:`inferloom.phases.strategy` wires it for
every workload, so no phase plans another phase's share (FRAMEWORK knows
nothing of KERNEL's). The split is asked where the search begins a tick: after
a pending trial has been measured, and, for a custom workload, once its source
patches are done.
"""

from __future__ import annotations

import math

from inferloom.phases.context import SessionContext, Step
from inferloom.phases.backend_choice import kernel_backend
from inferloom.session.state import Phase, SessionState

__all__ = ["kernel_reserve", "leave_kernel_share"]


def kernel_reserve(ctx: SessionContext, st: SessionState) -> str | None:
    """Why FRAMEWORK should end now to leave ``spec.kernels.budget_share`` of
    the session's budget to the KERNEL phase; None while it may go on (or when
    no kernel backend applies, or the share is 0, or the KERNEL phase has
    already had its turn in an earlier cycle: its candidates are decided once
    per session, so later cycles' FRAMEWORK may use the rest)."""
    share = float(ctx.spec.kernels.budget_share)
    if share <= 0.0 or st.extra.kernel_had_turn is not None:
        return None
    if kernel_backend(ctx, st)[0] is None:
        return None
    minutes = st.budget.minutes * (1.0 - share)
    trials = st.budget.trials - math.ceil(st.budget.trials * share)
    if st.used.elapsed_s >= minutes * 60:
        return (f"budget: {st.used.elapsed_s / 60:.1f} of {st.budget.minutes:g} minutes used, FRAMEWORK's part "
                f"{minutes:.1f}; the rest ({share * 100:.0f}%, spec.kernels.budget_share) is the KERNEL phase's")
    if st.used.trials >= trials:
        return (f"budget: {st.used.trials} of {st.budget.trials} trials used; the rest "
                f"({share * 100:.0f}%, spec.kernels.budget_share) is the KERNEL phase's")
    return None


def leave_kernel_share(search: Step) -> Step:
    """``search`` (a FRAMEWORK configuration-search tick) behind the split: a
    pending configuration trial is measured first; otherwise, once FRAMEWORK's
    share is used, the phase ends (its proposals cleared) and KERNEL begins."""

    def step(ctx: SessionContext, st: SessionState) -> None:
        pending = st.pending_action is not None and st.pending_action.action == "try_config"
        reserved = None if pending else kernel_reserve(ctx, st)
        if reserved:
            st.extra.proposals = []
            st.extra.framework_cut = st.cycle  # SWEEP's convergence check: this cycle's search was cut short
            ctx.enter_phase(st, Phase.KERNEL, reserved)
            return
        search(ctx, st)

    return step
