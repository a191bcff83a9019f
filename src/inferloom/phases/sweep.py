"""SWEEP phase: re-measure the final stack against stock over a small grid of
concurrency x input length (descriptive: a fixed number of pairs per point, no
early stop). Skipped, with its reason, when nothing was kept this cycle (or
the workload has no traffic grid: ``WorkloadStrategy.sweep_skip_reason``, or a ``traffic.trace``).
Then another cycle starts at FRAMEWORK, or the session closes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inferloom.phases.common import seed_base as _seed_base
from inferloom.phases.common import step_key as _key
from inferloom.measure.compare import compare
from inferloom.measure.records import Comparison
from inferloom.phases.context import SessionContext
from inferloom.session import ledger as L
from inferloom.session.state import Phase, SessionState
from inferloom.session.state_models import SweepPoint
from inferloom.workloads.base import ConfigError, ServerLogs, ServerReuse, resolve_config

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["grid", "sweep_step", "HEADROOM_WORTH_A_CYCLE"]


def grid(spec: WorkloadSpec) -> list[tuple[int, int]]:
    t = spec.traffic
    conc = sorted({max(1, t.concurrency // 2), t.concurrency})
    inl = sorted({max(8, t.input_len // 2), t.input_len})
    return [(c_, i_) for c_ in conc for i_ in inl]


def sweep_step(ctx: SessionContext, st: SessionState) -> None:
    """One SWEEP tick: one grid point measured, or the phase skipped / done."""
    kept_now = any(t.kept and t.cycle == st.cycle for t in st.trials)
    if st.extra.sweep is None:
        st.extra.sweep = {}
    done = st.extra.sweep.setdefault(str(st.cycle), [])
    out_of_time = ctx.time_left_s(st) <= 0
    no_grid = ctx.strategy.sweep_skip_reason or ("a trace's arrivals and lengths are the load (traffic.trace): no "
                                                 "concurrency x input-length grid" if ctx.spec.traffic.trace else None)
    if not ctx.options.sweep or not kept_now or out_of_time or no_grid:
        reason = (no_grid or ("sweep disabled" if not ctx.options.sweep else f"nothing was kept in cycle {st.cycle}"
                              if not kept_now else "the wall-clock budget is used up"))
        ctx.ledger.append(L.PHASE, {"action": "skip_phase", "phase": "SWEEP", "cycle": st.cycle, "reason": reason},
                        key=_key("sweep-skip", st.session_id, st.cycle))
        _next(ctx, st, kept_now)
        return
    points = grid(ctx.spec)
    todo = [p for p in points if list(p) not in [d.point for d in done]]
    if not todo:
        _next(ctx, st, kept_now)
        return
    conc, inl = todo[0]
    spec2 = ctx.spec.model_copy(update={"traffic": ctx.spec.traffic.model_copy(
        update={"concurrency": conc, "input_len": inl, "num_prompts": None})})
    pairs = ctx.options.sweep_pairs
    settings = ctx.settings.__class__(**{**ctx.settings.to_dict(), "min_pairs": pairs, "max_pairs": pairs})
    adapter = ctx.adapter_factory(spec2)
    if adapter is not ctx.adapter and isinstance(adapter, ServerLogs):  # server logs stay in the session
        adapter.set_log_dir(ctx.dir / "servers" / f"sweep-c{conc}-i{inl}", progress=ctx.progress)
    if adapter is not ctx.adapter and isinstance(ctx.adapter, ServerReuse):
        ctx.adapter.stop_idle()  # the device is this point's servers' now (its memory share is read with none alive)
    ctx.progress(f"SWEEP cycle {st.cycle}: concurrency {conc}, input {inl} ({len(done) + 1}/{len(points)})")
    key = _key("sweep", st.session_id, st.cycle, conc, inl)
    # Stock and the stack at this operating point: stock's defaults there (e.g.
    # micro_batch follows concurrency), plus the changes the session kept.
    knobs2 = adapter.knob_space()
    changes = {k: v for k, v in st.stack.items() if st.stock_config.get(k) != v}
    try:
        stock2 = resolve_config(knobs2, {}, st.pinned)
        stack2 = resolve_config(knobs2, {**stock2, **changes}, st.pinned)
    except ConfigError as exc:
        if adapter is not ctx.adapter:
            adapter.close()
        ctx.ledger.append(L.ERROR, {"what": "sweep point not applicable", "point": [conc, inl], "error": str(exc)}, key=key)
        done.append(SweepPoint(point=[conc, inl], verdict="not-applicable", error=str(exc)))
        return
    try:
        res, seq = ctx.measured(key, L.MEASUREMENT, lambda: {
            "action": "sweep", "cycle": st.cycle, "point": [conc, inl], **compare(
                adapter, spec2, stock2, stack2, settings=settings,
                seed_base=_seed_base(ctx.spec.seed, 50_000 + 100 * st.cycle + len(done)), refs=None,
                progress=ctx.progress, stop_early=False, labels=("stock", "stack")).as_dict()})
    finally:
        if adapter is not ctx.adapter:
            adapter.close()
            ctx.record_server_starts(adapter)
    m = Comparison.from_dict(res)  # this measurement's ledger entry, or a resumed session's
    d = m.decision
    done.append(SweepPoint(point=[conc, inl], ratio=d.ratio, ci_low=d.ci_low, ci_high=d.ci_high,
                           verdict=m.verdict, ledger_seq=seq))


# Another cycle is worth running only while the stack is further than this
# from the roofline ceiling (stock's measured headroom over the kept gain).
HEADROOM_WORTH_A_CYCLE = 1.10


def _headroom_left(st: SessionState) -> float | None:
    head = st.extra.roofline_stock.headroom if st.extra.roofline_stock is not None else None
    if not isinstance(head, (int, float)):
        return None
    return float(head) / float(st.extra.stack_ratio if st.extra.stack_ratio is not None else 1.0)


def _next(ctx: SessionContext, st: SessionState, kept_now: bool) -> None:
    reason = st.stop_reason or ctx.budget_reason(st)
    if reason:
        st.stop_reason = reason
        ctx.enter_phase(st, Phase.CLOSE, reason)
    elif not kept_now and st.extra.framework_cut == st.cycle and st.cycle < ctx.options.cycle_ceiling:
        _another_cycle(ctx, st, f"cycle {st.cycle} kept nothing, but its FRAMEWORK search ended early to leave the "
                                "KERNEL phase its share: the rest of the budget is the configuration search's")
    elif not kept_now:
        st.stop_reason = f"converged: cycle {st.cycle} kept nothing"
        ctx.enter_phase(st, Phase.CLOSE, st.stop_reason)
    elif _headroom_left(st) is not None and _headroom_left(st) < HEADROOM_WORTH_A_CYCLE:
        st.stop_reason = (f"converged: the stack is within {(HEADROOM_WORTH_A_CYCLE - 1) * 100:.0f}% of the roofline "
                          f"(headroom x{_headroom_left(st):.2f})")
        ctx.enter_phase(st, Phase.CLOSE, st.stop_reason)
    elif st.cycle >= ctx.options.cycle_ceiling:
        st.stop_reason = f"cycle ceiling ({ctx.options.cycle_ceiling}) reached"
        ctx.enter_phase(st, Phase.CLOSE, st.stop_reason)
    else:
        _another_cycle(ctx, st, f"cycle {st.cycle} kept something; another cycle from the established stack")


def _another_cycle(ctx: SessionContext, st: SessionState, why: str) -> None:
    st.cycle += 1
    st.extra.proposals = []
    st.extra.cycle_started_at = ctx.clock()
    ctx.enter_phase(st, Phase.FRAMEWORK, why)
