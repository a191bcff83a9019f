"""The coordinator: code, not an agent. It runs every benchmark, applies and
reverts changes, enforces the phase allowlists, and persists state.

Phases: PRELUDE (stock baseline + A/A noise floor, warm replay, profile) ->
ENABLEMENT (only when stock fails) -> FRAMEWORK (configuration search; source
patches first for a custom workload) -> KERNEL (kernel candidates from a
backend, through correctness and microbenchmark gates, then measured end to
end; skipped with its reason when no backend applies or no profiled op is
hot enough) -> SWEEP (final stack vs stock over a concurrency x input-length
grid; skipped with its reason when nothing was kept this cycle) -> another
cycle at FRAMEWORK, or CLOSE.

The budget is the coordinator's, and so is its split between phases: the
run loop ends the search once the session's budget is used, and
FRAMEWORK's configuration search leaves KERNEL its share
(:mod:`inferloom.phases.budget`, wired into every workload's FRAMEWORK by
:mod:`inferloom.phases.strategy`). Phases are peers: none imports another.

Every tick re-reads ``state.json`` (the source of truth), does one step
(:data:`STEPS`, one per phase, each given the :class:`SessionContext`), and
writes it back atomically before the next. A step that measures first records
itself as ``pending_action`` with a ledger key; its ledger entries carry keys
derived from it, so after a crash ``resume`` reuses a measurement that reached
the ledger instead of measuring again, and never duplicates an entry.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from inferloom.kb import default_kb_url
from inferloom.phases.close import close_step
from inferloom.phases.common import step_key
from inferloom.phases.context import Agents, Progress, SessionContext, SessionOptions, Step
from inferloom.phases.enablement import enablement_step
from inferloom.phases.kernel import kernel_step
from inferloom.phases.prelude import prelude_step
from inferloom.phases.strategy import strategy_for
from inferloom.phases.sweep import sweep_step
from inferloom.session import ledger as L
from inferloom.session.state import Phase, SessionState, load_state
from inferloom.workloads.base import RejectedFlags, ServerLogs, ServerReuse, ServerRuns, WorkloadAdapter

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["Coordinator", "STEPS"]


def _framework_step(ctx: SessionContext, st: SessionState) -> None:
    ctx.strategy.framework_step(ctx, st)  # the workload's own FRAMEWORK (configuration, or patches first)


STEPS: dict[Phase, Step] = {
    Phase.PRELUDE: prelude_step,
    Phase.ENABLEMENT: enablement_step,
    Phase.FRAMEWORK: _framework_step,
    Phase.KERNEL: kernel_step,
    Phase.SWEEP: sweep_step,
    Phase.CLOSE: close_step,
}


class Coordinator:
    """Drives one session directory. ``run()`` returns when the session is DONE.

    ``agents``: who proposes and judges; ``options``: how the session runs;
    ``adapter_factory(spec)``: an adapter for another operating point (SWEEP;
    default: this adapter); ``clock``: wall-clock seconds (tests pass their own)."""

    def __init__(self, directory: str | Path, spec: WorkloadSpec, adapter: WorkloadAdapter, *, agents: Agents,
                 options: SessionOptions = SessionOptions(), progress: Progress = lambda _m: None,
                 adapter_factory: Callable[[Any], WorkloadAdapter] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        d = Path(directory)
        if options.kb_url == "default":
            options = replace(options, kb_url=default_kb_url())
        if isinstance(adapter, ServerLogs):  # server adapters keep each server's log in the session
            adapter.set_log_dir(d / "servers", progress=progress)
        self.ctx = SessionContext(d, spec, adapter, agents=agents, options=options, strategy=strategy_for(spec),
                                  progress=progress, clock=clock,
                                  adapter_factory=adapter_factory or (lambda _spec: adapter))
        ledger = self.ctx.ledger
        if ledger.recovered_torn_line:
            ledger.append(L.ERROR, {"what": "recovered a torn last ledger line after a crash",
                                    "dropped_bytes": len(ledger.torn_bytes)})
        self.ctx.strategy.bind(self.ctx)
        if isinstance(adapter, ServerReuse):  # one start per configuration while it lives; a pair at most
            adapter.reuse_servers(True, max_live=2)

    def close(self) -> None:
        """End of the session (or an interrupt): the servers kept for reuse are
        stopped, their starts recorded, the ledger closed."""
        try:
            if isinstance(self.ctx.adapter, ServerReuse):
                self.ctx.adapter.stop_idle()
                self.ctx.record_server_starts()
        finally:
            self.ctx.close()

    def run(self) -> SessionState:
        ctx = self.ctx
        while True:
            st = load_state(ctx.dir)
            if st.phase == Phase.DONE:
                return st
            reason = ctx.budget_reason(st)
            if reason and not st.stop_reason and st.phase in (Phase.FRAMEWORK, Phase.ENABLEMENT):
                # The search stops; the stack found so far is still swept (time
                # permitting) and compared against stock at CLOSE.
                st.stop_reason = reason
                st.pending_action = None
                st.extra.proposals = []
                ctx.enter_phase(st, Phase.KERNEL if st.phase == Phase.FRAMEWORK else Phase.CLOSE, reason)
                ctx.save(st)
                continue
            _sync_rejected_flags(ctx, st, restore=True)
            try:
                STEPS[st.phase](ctx, st)
            finally:
                ctx.record_server_starts()
            _sync_rejected_flags(ctx, st, restore=False)
            _learn_stock_runs(ctx, st)
            ctx.save(st)


def _sync_rejected_flags(ctx: SessionContext, st: SessionState, *, restore: bool) -> None:
    """Flags the installed server rejected (learned by a server adapter from a
    launch error) live in the session state: restored into the adapter after a
    resume, and read by ``validate_proposal`` so they are never proposed again.
    Each newly learned flag is also a ledger entry."""
    adapter = ctx.adapter
    if not isinstance(adapter, RejectedFlags):
        return
    learned = adapter.rejected_flags
    if restore and st.extra.rejected_flags:
        adapter.restore_rejected_flags(st.extra.rejected_flags)
    elif not restore and learned:
        known = st.extra.rejected_flags or {}
        for flag in sorted(set(learned) - set(known)):
            ctx.ledger.append(L.ERROR, {"what": "server rejected a flag; never proposed again in this session",
                                        "flag": flag, **{("failure_kind" if k == "kind" else k): v
                                                         for k, v in learned[flag].items()}},
                              key=step_key("rejected_flag", st.session_id, flag))
            ctx.progress(f"learned: the server rejects {flag} ({learned[flag].get('knob')}); never proposed again")
        st.extra.rejected_flags = {k: dict(v) for k, v in learned.items()}


def _learn_stock_runs(ctx: SessionContext, st: SessionState) -> None:
    """Once stock's server has started: what its log said it runs (``ServerRuns``), kept in the state, where the
    orchestrator reads it (a change to a value stock already runs starts the same server: never proposed)."""
    adapter = ctx.adapter
    if st.extra.stock_runs is not None or not st.stock_config or not isinstance(adapter, ServerRuns):
        return
    runs = adapter.server_runs(st.stock_config)
    if runs is None:
        return
    st.extra.stock_runs = runs
    if runs:
        ctx.progress("the stock server's log says it runs " + ", ".join(f"{k}={v['value']}" for k, v in runs.items())
                     + ": a change to one of these values is the same server, never proposed")
