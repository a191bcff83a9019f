"""What a phase step receives: the :class:`SessionContext`.

A phase step is ``step(ctx: SessionContext, st: SessionState) -> None``. The
context holds everything a step reads (the spec, the adapter and its knobs,
the protocol settings, stock's quality references, the ledger, the agents,
the run options, the clock, the session directory) and the few things a step
does besides measuring, as public methods: persist the state (:meth:`save`),
move to another phase (:meth:`enter_phase`), measure once across a resume
(:meth:`measured`), record the servers an adapter started (:meth:`record_server_starts`), refuse an agent's output (:meth:`refuse`,
:meth:`record_refusal`), and read the budget (:meth:`time_left_s`,
:meth:`budget_reason`).

:class:`Agents` and :class:`SessionOptions` group what a session is run with;
:class:`WorkloadStrategy` is what differs between a configuration-only
workload and a custom one (implementations in :mod:`inferloom.phases.strategy`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from inferloom.agents.base import Critic, Orchestrator, Robustness
from inferloom.kernels.base import KernelBackend
from inferloom.measure.protocol import ProtocolSettings
from inferloom.phases.common import jsonable, step_key
from inferloom.measure.reference_store import FILE as REFS_FILE
from inferloom.measure.compare import References
from inferloom.session import ledger as L
from inferloom.session.state import Phase, SessionState, save_state
from inferloom.workloads.base import Knob, ServerReuse, WorkloadAdapter

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["Agents", "SessionOptions", "SessionContext", "WorkloadStrategy", "Step", "Progress"]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Agents:
    """The agents a session asks: the orchestrator proposes, a fresh critic
    (from ``critic_factory``) rules on each trial, robustness may end a phase.
    A custom workload may also be given its patch source and patch critic
    (else the spec's sources and :class:`~inferloom.patches.critic.RulePatchCritic`)."""

    orchestrator: Orchestrator
    critic_factory: Callable[[], Critic]
    robustness: Robustness
    patch_source: Any = None
    patch_critic_factory: Callable[[], Any] | None = None
    llm: Any = None  # the session's LLMClient when agents.llm is set: its budget_reason() stops the search
    kernel_author: Any = None  # the LLM kernel author (agents/llm_kernel.py) when agents.llm.roles names it

    @classmethod
    def of(cls, agents: "Agents | Mapping[str, Any]") -> "Agents":
        """``agents`` itself, or built from a mapping of the same fields."""
        return agents if isinstance(agents, Agents) else cls(**dict(agents))


@dataclass(frozen=True)
class SessionOptions:
    """How a session is run (``optimize``'s --cycles, --no-sweep, --kb / --no-kb and the rest).

    ``kb_url``: ``"default"`` resolves to the default knowledge base, None runs
    without one. ``kernel_backend``: None lets ``spec.kernels.backend`` decide."""

    cycle_ceiling: int = 3
    sweep: bool = True
    sweep_pairs: int = 3
    kb_url: str | None = "default"
    replay_min_confidence: float = 0.5
    replay_fraction: float = 0.5
    kernel_backend: KernelBackend | None = None
    llm_replay: str | None = None  # a session directory whose recorded LLM exchanges answer this session's calls


Step = Callable[["SessionContext", SessionState], None]


class WorkloadStrategy(Protocol):
    """What differs between workloads whose stack is a configuration and
    custom workloads whose stack also holds source patches; chosen once from
    the spec (:func:`inferloom.phases.strategy.strategy_for`)."""

    name: str
    sweep_skip_reason: str | None  # why SWEEP never runs for this workload, or None

    def bind(self, ctx: "SessionContext") -> None:
        """At coordinator start (and resume): set up what the workload needs."""
        ...

    def framework_step(self, ctx: "SessionContext", st: SessionState) -> None:
        """One FRAMEWORK tick."""
        ...

    def close_measure(self, ctx: "SessionContext", st: SessionState) -> None:
        """CLOSE's measurements: the final stack against stock, and what else the workload checks."""
        ...


class SessionContext:
    """The typed, public view of a running session that phase steps receive."""

    def __init__(self, directory: Path, spec: WorkloadSpec, adapter: WorkloadAdapter, *, agents: Agents,
                 options: SessionOptions, strategy: WorkloadStrategy, progress: Progress,
                 clock: Callable[[], float], adapter_factory: Callable[[Any], Any]) -> None:
        self.dir = directory
        self.spec = spec
        self.adapter = adapter
        self.agents = agents
        self.options = options
        self.strategy = strategy
        self.progress = progress
        self.clock = clock
        self.adapter_factory = adapter_factory
        self.knobs: list[Knob] = adapter.knob_space()
        self.settings = ProtocolSettings.from_spec(spec.protocol)
        self.refs = References(directory / REFS_FILE)  # stock's quality references, captured once per session
        self.ledger = L.Ledger(directory)
        self._tick_t = clock()

    @property
    def kb_url(self) -> str | None:
        """The knowledge base's URL; None: no knowledge base."""
        return self.options.kb_url

    # ---------------------------------------------------------------- state
    def save(self, st: SessionState) -> None:
        """Count the wall-clock time since the last save, then write ``state.json`` atomically."""
        now = self.clock()
        st.used.elapsed_s += max(0.0, now - self._tick_t)
        self._tick_t = now
        st.last_ledger_seq = self.ledger.last_seq
        save_state(self.dir, st)

    def elapsed_s(self, st: SessionState) -> float:
        """Wall-clock time used, including the time since the last save."""
        return st.used.elapsed_s + max(0.0, self.clock() - self._tick_t)

    def enter_phase(self, st: SessionState, phase: Phase, why: str) -> None:
        """Move to ``phase``: a ledger entry saying why, and a progress line."""
        self.ledger.append(L.PHASE, {"from": st.phase.value, "to": phase.value, "cycle": st.cycle, "why": why},
                           key=step_key("phase", st.session_id, st.phase.value, phase.value, st.cycle, len(st.trials)))
        self.progress(f"phase {st.phase.value} -> {phase.value}: {why}")
        st.phase = phase

    # ---------------------------------------------------------------- budget
    def time_left_s(self, st: SessionState) -> float:
        return st.budget.minutes * 60 - st.used.elapsed_s

    def budget_reason(self, st: SessionState) -> str | None:
        """Why the budget is used up, or None while some is left."""
        if st.used.elapsed_s >= st.budget.minutes * 60:
            return f"budget: {st.budget.minutes:g} wall-clock minutes used"
        if st.used.trials >= st.budget.trials:
            return f"budget: {st.budget.trials} trials used"
        return self.agents.llm.budget_reason() if self.agents.llm is not None else None

    # ----------------------------------------------------------- measuring
    def measured(self, key: str, kind: str, fn: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], int]:
        """Reuse a measurement already in the ledger under ``key``, else take
        it with ``fn`` and append it. Returns (record, ledger seq)."""
        found = self.ledger.find(key)
        if found is not None:
            self.progress("resume: reusing the measurement already in the ledger")
            return found, found["seq"]
        try:
            res = fn()
        finally:
            self.record_server_starts()  # before the measurement: the ledger in the order things happened
        seq = self.ledger.append(kind, res, key=key)
        return res, seq

    def record_server_starts(self, adapter: Any = None) -> list[int]:
        """One ledger entry (:data:`~inferloom.session.ledger.SERVER_START`) per
        server ``adapter`` (default: the session's) started since the last call;
        their ``startup_s`` is its own category of the time breakdown."""
        a = self.adapter if adapter is None else adapter
        if not isinstance(a, ServerReuse):
            return []
        return [self.ledger.append(L.SERVER_START, jsonable(ev), key=step_key("server_start", ev.get("started_at"),
                                                                              ev.get("handle"), ev.get("config")))
                for ev in a.take_server_starts()]

    # ------------------------------------------------------------- refusals
    def record_refusal(self, st: SessionState, rule: str, why: str, agent: str, output: Any, key: str) -> None:
        """One refusal entry in the ledger (the one place they are written) and its progress line."""
        self.ledger.append(L.REFUSAL, {"rule": rule, "why": why, "agent": agent, "output": jsonable(output),
                                       "phase": st.phase.value, "cycle": st.cycle}, key=key)
        self.progress(f"refused ({rule}): {why}")

    def refuse(self, st: SessionState, rule: str, why: str, raw: Any, agent: str) -> None:
        """An agent's output refused: recorded, and counted toward the refusal limit."""
        self.record_refusal(st, rule, why, agent, raw,
                            step_key("refusal", st.session_id, st.cycle, len(st.trials),
                                     st.extra.refusals_total or 0, rule))
        st.extra.refusals_in_a_row = (st.extra.refusals_in_a_row or 0) + 1
        st.extra.add_proposal(jsonable(raw.get("changes") if isinstance(raw, Mapping) else raw))

    def close(self) -> None:
        self.ledger.close()

