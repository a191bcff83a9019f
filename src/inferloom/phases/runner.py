"""Start or resume a session directory: the glue between the CLI and the
coordinator. ``optimize`` writes manifest.json and the first state.json, then
runs; ``resume`` restores the workload from manifest.json and continues.

``resume`` first checks that state.json and ledger.jsonl agree
(:func:`inferloom.session.consistency.check_consistency`): it never finishes
a session from a partial history. A KB URL is kept in state.json without its
password; ``resume`` takes the real one again from ``kb_url`` (its ``--kb``)
or ``$INFERLOOM_KB`` (:func:`resume_kb_url`)."""

from __future__ import annotations

import math
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from inferloom.agents.llm_setup import llm_agents
from inferloom.agents.rules import RuleCritic, RuleOrchestrator, RuleRobustness
from inferloom.errors import InferloomError
from inferloom.phases.context import Agents, SessionOptions
from inferloom.kb.db import to_url
from inferloom.phases.coordinator import Coordinator
from inferloom.preflight import check_runnable
from inferloom.redact import has_redacted_password, redact_url
from inferloom.session import ledger as L
from inferloom.session.consistency import check_consistency
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
from inferloom.workloads.base import CrossKnobRules, resolve_config
from inferloom.workloads.registry import make_adapter

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["SessionExists", "InvalidBudget", "KBPasswordMissing", "ReplayWithoutLLM", "default_agents", "recorded_llm_spec", "start", "resume", "resume_kb_url",
           "PERSISTED_OPTIONS"]

# how a session was asked to run (optimize's --cycles, --no-sweep, --kb / --no-kb):
# kept in state.json so that `resume` continues it the same way
PERSISTED_OPTIONS = ("cycle_ceiling", "sweep", "kb_url", "llm_replay")


class SessionExists(InferloomError, ValueError):
    """The output directory already holds a session."""


class InvalidBudget(InferloomError, ValueError):
    """``budget_minutes`` is not a positive finite number or ``max_trials`` is under 1."""


class KBPasswordMissing(InferloomError, ValueError):
    """state.json keeps the KB URL without its password and it was not given again."""


class ReplayWithoutLLM(InferloomError, ValueError):
    """``--llm-replay`` names a session that recorded no LLM exchanges."""


AgentsArg = Agents | Mapping[str, Any] | None


def default_agents(spec: WorkloadSpec, directory: Path | None = None, llm_replay: str | None = None,
                   adapter: Any = None) -> Agents:
    """The deterministic agents, with the roles ``spec.agents.llm`` names played by an LLM
    (:func:`inferloom.agents.llm_setup.llm_agents`; ``llm_replay``: a recorded session answers instead).
    An ``adapter`` with :class:`~inferloom.workloads.base.CrossKnobRules` tells the orchestrator its rules."""
    feasible = (lambda cfg: adapter.config_refusal(cfg) is None) if isinstance(adapter, CrossKnobRules) else None
    agents = Agents(orchestrator=RuleOrchestrator(seed=spec.seed, feasible=feasible), critic_factory=RuleCritic,
                    robustness=RuleRobustness())
    if directory is None or (spec.agents.llm is None and llm_replay is None):
        return agents
    llm = spec.agents.llm if spec.agents.llm is not None else recorded_llm_spec(llm_replay)
    return replace(agents, **llm_agents(llm, directory, llm_replay, lambda: load_state(directory).to_dict()))


def recorded_llm_spec(session_dir: str | None) -> Any:
    """The ``agents.llm`` section of the session ``session_dir`` (for ``--llm-replay`` when the spec has none)."""
    d = Path(str(session_dir))
    llm = manifest_spec(d, read_manifest(d)).agents.llm
    if llm is None:
        raise ReplayWithoutLLM(f"--llm-replay {d}: that session ran without agents.llm, so there is nothing to "
                               "replay; name a session that used an LLM")
    return llm


def _coordinator(directory: Path, spec: WorkloadSpec, adapter: Any, agents: AgentsArg, progress: Callable[[str], None], *,
                 adapter_factory: Callable[[Any], Any] = make_adapter, clock: Callable[[], float] = time.time,
                 **options: Any) -> Coordinator:
    """``options``: :class:`SessionOptions` fields."""
    agents = Agents.of(agents) if agents else default_agents(spec, directory, options.get("llm_replay"), adapter)
    return Coordinator(directory, spec, adapter, agents=agents,
                       options=SessionOptions(**options), progress=progress, adapter_factory=adapter_factory,
                       clock=clock)


def _run(directory: Path, spec: WorkloadSpec, adapter: Any, agents: AgentsArg,
         progress: Callable[[str], None], **kw: Any) -> SessionState:
    c = _coordinator(directory, spec, adapter, agents, progress, **kw)
    try:
        return c.run()
    finally:
        c.close()


def start(directory: str | Path, spec: WorkloadSpec, *, budget_minutes: float, max_trials: int, adapter: Any = None,
          agents: AgentsArg = None, progress: Callable[[str], None] = lambda _m: None,
          **kw: Any) -> SessionState:
    """Start a session in ``directory`` and run it to the end (``agents``: an
    :class:`Agents` or a mapping of its fields; ``kw``: :class:`SessionOptions`
    fields, ``adapter_factory``, ``clock``). A relative ``directory`` is made
    absolute once, here (git worktrees of a custom workload are made from
    inside the clone); without an ``adapter``, a configuration that can't work
    is refused (:func:`~inferloom.preflight.check_runnable`) before ``directory``
    is created."""
    d = Path(directory).absolute()
    if (d / "state.json").exists() or (d / "ledger.jsonl").exists():
        raise SessionExists(f"{d} already holds a session; continue it with `inferloom resume {d}` or choose another --out")
    if not (budget_minutes > 0 and math.isfinite(budget_minutes)):
        raise InvalidBudget(f"--budget-minutes: got {budget_minutes}, expected a positive number")
    if max_trials < 1:
        raise InvalidBudget(f"--max-trials: got {max_trials}, expected an integer >= 1")
    if adapter is None:
        check_runnable(spec)
    own = adapter is None
    adapter = adapter if adapter is not None else make_adapter(spec)  # its own checks (texts, tokenizer) first:
    d.mkdir(parents=True, exist_ok=True)  # a spec the adapter refuses leaves no directory behind
    try:
        knobs = adapter.knob_space()
        stock = resolve_config(knobs, {}, spec.pinned)
        st = SessionState(session_id=new_session_id(), budget=Budget(minutes=budget_minutes, trials=max_trials),
                          device=spec.resolved_device(), knobs=[k.to_dict() for k in knobs], pinned=dict(spec.pinned),
                          workload={"model": spec.model, "dtype": spec.dtype, **spec.traffic.model_dump()},
                          stock_config=stock, stack=dict(stock))
        given = {k: kw[k] for k in PERSISTED_OPTIONS if k in kw}
        if given.get("kb_url"):  # no password in state.json: resume asks for it again
            given["kb_url"] = redact_url(given["kb_url"])
        st.extra.run_options = RunOptions(**given)
        write_manifest(d, build_manifest(spec, adapter.describe(), {
            "spec_seed": spec.seed, "bootstrap_seed": spec.protocol.bootstrap_seed, "session_id": st.session_id}))
        save_state(d, st)
        return _run(d, spec, adapter, agents, progress, **kw)
    finally:
        if own:
            adapter.close()


def resume(directory: str | Path, *, adapter: Any = None, agents: AgentsArg = None,
           progress: Callable[[str], None] = lambda _m: None, **kw: Any) -> SessionState:
    """Continue the session in ``directory`` with the options it was started with (unless given again);
    without an ``adapter``, the manifest's spec is checked first (:func:`~inferloom.preflight.check_runnable`)."""
    d = Path(directory).absolute()
    manifest = read_manifest(d)
    st = load_state(d)
    check_consistency(d, st, L.read_entries(d))
    spec = manifest_spec(d, manifest)
    if st.phase == Phase.DONE:  # nothing left to run: no adapter (a session from another machine's device reports here too)
        progress(f"session {st.session_id} is already closed ({st.stop_reason}); nothing to resume")
        return st
    progress(f"resuming session {st.session_id} in phase {st.phase.value}, cycle {st.cycle}, "
             f"{st.used.trials} trials and {st.used.elapsed_s / 60:.1f} min used")
    given = st.extra.run_options.model_dump() if st.extra.run_options is not None else {}
    if given.get("kb_url") and "kb_url" not in kw:  # not given again: the stored one, with its password
        kw["kb_url"] = resume_kb_url(d, given["kb_url"], os.environ, progress)
    kw = {**given, **kw}  # the options it was started with, unless given again
    own = adapter is None
    if own:
        check_runnable(spec)
    adapter = adapter if adapter is not None else make_adapter(spec)
    try:
        return _run(d, spec, adapter, agents, progress, **kw)
    finally:
        if own:
            adapter.close()


def resume_kb_url(directory: Path, stored: str | None, environ: Mapping[str, str],
                  progress: Callable[[str], None] = lambda _m: None) -> str | None:
    """The KB URL a resumed session uses when none is given again: the stored one
    when it has no redacted password; else ``$INFERLOOM_KB`` when it is the same
    URL with its password; else :class:`KBPasswordMissing` (what to pass)."""
    if not has_redacted_password(stored):
        return stored
    env = environ.get("INFERLOOM_KB")
    if env and redact_url(to_url(env)) == stored:
        progress(f"knowledge base: {stored} (its password taken from $INFERLOOM_KB)")
        return to_url(env)
    raise KBPasswordMissing(
        f"{directory}: the session's knowledge base {stored} is kept without its password (never written to disk); "
        f"give it again: `inferloom resume {directory} --kb URL` or set INFERLOOM_KB to it, or pass --no-kb")
