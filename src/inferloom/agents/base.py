"""Agent Protocols. The coordinator (code) runs every benchmark and keeps or
reverts; agents only propose and rule on evidence they are handed.

Every agent's input and output is written to the ledger by the coordinator.
An output that is malformed (not a dict, unknown action, unknown knob, value
outside the knob's domain, a configuration already measured) is refused by the
coordinator with a named rule, and the session goes on. An LLM-backed agent
must fit the same Protocols; the deterministic ones in ``rules.py`` are the
default and work offline.

The state an agent sees is the JSON dict of ``state.json`` as loaded from disk
(never the coordinator's memory): keys used by agents are documented in
``inferloom.session.state`` (``phase``, ``cycle``, ``device``, ``knobs`` (list of
Knob dicts), ``stock_config``, ``stack`` (the current kept configuration),
``trials`` (list of {config, changes, verdict, ratio, ci_low, ci_high,
quality_passed, rule, agent}), ``noise_floor``, ``workload`` (concurrency,
input_len, output_len, dtype, model)).

Every agent has a non-empty ``name`` (the ledger's ``agent``), changes
nothing it is handed, and the deterministic ones give the same output for the
same input (and seed). ``tests/test_agent_conformance.py`` checks these
contracts for every implementation registered there.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, runtime_checkable

from inferloom.measure.records import Evidence

__all__ = ["ACTIONS", "Orchestrator", "Critic", "Robustness"]

# Every action name an agent may emit; which phase admits which is the
# coordinator's phase allowlist (phases/allowlist.py: PHASE_ALLOWLIST, beside validate_proposal).
ACTIONS = (
    "try_config",   # FRAMEWORK: measure stack+changes against the stack
    "end_phase",    # FRAMEWORK: nothing more worth trying this cycle
    "stop",         # any phase: ask the coordinator to close the session
    "try_kernel",   # KERNEL: measure stack+kernel knob changes against the stack (coordinator only)
)


@runtime_checkable
class Orchestrator(Protocol):
    """Chooses the next action from the state file alone, re-read every tick.

    ``propose(state) -> dict`` returns
    ``{"action": "try_config", "changes": {knob: value, ...},
    "predicted_gain": float | None, "rationale": str, "source": "prior" | "search"}``
    or ``{"action": "end_phase", "rationale": str}``. ``changes`` are relative
    to ``state["stack"]``; the resulting full configuration must not have been
    measured before (``state["trials"]``, ``state["measured_config_keys"]``).
    Whatever it returns passes the coordinator's ``validate_proposal`` for the
    FRAMEWORK phase: known knobs of the FRAMEWORK phase only (KERNEL knobs are
    the kernel backend's), applicable to ``state["device"]``, none of
    ``state["pinned"]``, values in their domains, a real change. When nothing
    unmeasured is left it answers ``end_phase``."""

    name: str

    def propose(self, state: Mapping[str, Any]) -> Any: ...


@runtime_checkable
class Critic(Protocol):
    """Created fresh for each keep/revert decision; sees only the evidence.

    ``judge(evidence) -> {"decision": "keep" | "revert", "lesson": str}``
    where ``evidence`` (:class:`inferloom.measure.records.Evidence`; its
    ``as_dict()``, or a plain mapping with its keys, is the same evidence)
    holds the protocol verdict and decision (ratio, interval, pairs), the
    quality verdict, the noise floor and the changes.
    The Critic may never keep what the protocol did not keep (``revert``,
    ``inconclusive``, ``failed``), what failed or has no quality verdict, or a
    gain whose interval's lower bound does not clear the noise floor; the
    coordinator enforces this too (``critic_keep_without_evidence``). Malformed
    evidence is reverted, not raised on (fail-closed). The lesson is one line."""

    name: str

    def judge(self, evidence: Evidence) -> Any: ...


@runtime_checkable
class Robustness(Protocol):
    """Circuit breaker. ``check(state, now) -> None`` when all is well, else
    ``{"action": "end_phase" | "stop", "rule": str, "reason": str}`` when it
    detects N consecutive failures, a repeated proposal, or no progress (no
    keep) for T minutes of session time. Anything else it returns is refused
    (``malformed_output``)."""

    name: str

    def check(self, state: Mapping[str, Any], now: float) -> Any: ...
