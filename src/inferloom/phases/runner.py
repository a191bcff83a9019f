"""Start or resume a session directory: the glue between the CLI and the
coordinator. ``optimize`` writes manifest.json and the first state.json, then
runs; ``resume`` restores the workload from manifest.json and continues."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from inferloom.agents.rules import RuleCritic, RuleOrchestrator, RuleRobustness
from inferloom.errors import InferloomError
from inferloom.phases.context import Agents, SessionOptions
from inferloom.phases.coordinator import Coordinator
from inferloom.session.manifest import build_manifest, manifest_spec, read_manifest, write_manifest
from inferloom.session.state import (
    Budget,
    Phase,
    SessionState,
    load_state,
    new_session_id,
    save_state,
)
from inferloom.session.state_models import RunOptions
from inferloom.workloads.base import resolve_config
from inferloom.workloads.registry import make_adapter

__all__ = ["SessionExists", "default_agents", "start", "resume", "PERSISTED_OPTIONS"]

# how a session was asked to run (optimize's --cycles, --no-sweep, --kb / --no-kb):
# kept in state.json so that `resume` continues it the same way
PERSISTED_OPTIONS = ("cycle_ceiling", "sweep", "kb_url")


class SessionExists(InferloomError, ValueError):
    """The output directory already holds a session."""


AgentsArg = Agents | Mapping[str, Any] | None


def default_agents(spec: Any) -> Agents:
    return Agents(orchestrator=RuleOrchestrator(seed=spec.seed), critic_factory=RuleCritic,
                  robustness=RuleRobustness())


def _coordinator(directory: Path, spec: Any, adapter: Any, agents: AgentsArg, progress: Callable[[str], None], *,
                 adapter_factory: Callable[[Any], Any] = make_adapter, clock: Callable[[], float] = time.time,
                 **options: Any) -> Coordinator:
    """``options``: :class:`SessionOptions` fields."""
    return Coordinator(directory, spec, adapter, agents=Agents.of(agents) if agents else default_agents(spec),
                       options=SessionOptions(**options), progress=progress, adapter_factory=adapter_factory,
                       clock=clock)


def _run(directory: Path, spec: Any, adapter: Any, agents: AgentsArg,
         progress: Callable[[str], None], **kw: Any) -> SessionState:
    c = _coordinator(directory, spec, adapter, agents, progress, **kw)
    try:
        return c.run()
    finally:
        c.close()


def start(directory: str | Path, spec: Any, *, budget_minutes: float, max_trials: int, adapter: Any = None,
          agents: AgentsArg = None, progress: Callable[[str], None] = lambda _m: None,
          **kw: Any) -> SessionState:
    """Start a session in ``directory`` and run it to the end (``agents``: an
    :class:`Agents` or a mapping of its fields; ``kw``: :class:`SessionOptions`
    fields, ``adapter_factory``, ``clock``)."""
    d = Path(directory)
    if (d / "state.json").exists() or (d / "ledger.jsonl").exists():
        raise SessionExists(f"{d} already holds a session; continue it with `inferloom resume {d}` or choose another --out")
    if not (budget_minutes > 0 and math.isfinite(budget_minutes)):
        raise ValueError(f"--budget-minutes: got {budget_minutes}, expected a positive number")
    if max_trials < 1:
        raise ValueError(f"--max-trials: got {max_trials}, expected an integer >= 1")
    d.mkdir(parents=True, exist_ok=True)
    own = adapter is None
    adapter = adapter if adapter is not None else make_adapter(spec)
    try:
        knobs = adapter.knob_space()
        stock = resolve_config(knobs, {}, spec.pinned)
        st = SessionState(session_id=new_session_id(), budget=Budget(minutes=budget_minutes, trials=max_trials),
                          device=spec.resolved_device(), knobs=[k.to_dict() for k in knobs], pinned=dict(spec.pinned),
                          workload={"model": spec.model, "dtype": spec.dtype, **spec.traffic.model_dump()},
                          stock_config=stock, stack=dict(stock))
        st.extra.run_options = RunOptions(**{k: kw[k] for k in PERSISTED_OPTIONS if k in kw})
        write_manifest(d, build_manifest(spec, adapter.describe(), {
            "spec_seed": spec.seed, "bootstrap_seed": spec.protocol.bootstrap_seed, "session_id": st.session_id}))
        save_state(d, st)
        return _run(d, spec, adapter, agents, progress, **kw)
    finally:
        if own:
            adapter.close()


def resume(directory: str | Path, *, adapter: Any = None, agents: AgentsArg = None,
           progress: Callable[[str], None] = lambda _m: None, **kw: Any) -> SessionState:
    """Continue the session in ``directory`` with the options it was started with (unless given again)."""
    d = Path(directory)
    manifest = read_manifest(d)
    st = load_state(d)
    spec = manifest_spec(d, manifest)
    if st.phase == Phase.DONE:  # nothing left to run: no adapter (a session from another machine's device reports here too)
        progress(f"session {st.session_id} is already closed ({st.stop_reason}); nothing to resume")
        return st
    progress(f"resuming session {st.session_id} in phase {st.phase.value}, cycle {st.cycle}, "
             f"{st.used.trials} trials and {st.used.elapsed_s / 60:.1f} min used")
    given = st.extra.run_options.model_dump() if st.extra.run_options is not None else {}
    kw = {**given, **kw}  # the options it was started with, unless given again
    own = adapter is None
    adapter = adapter if adapter is not None else make_adapter(spec)
    try:
        return _run(d, spec, adapter, agents, progress, **kw)
    finally:
        if own:
            adapter.close()
