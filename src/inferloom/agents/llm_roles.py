"""LLM-backed Orchestrator and Critic: the same Protocols as the deterministic
agents (:mod:`inferloom.agents.base`), so their outputs go through the very
same gates (the phase allowlist and ``validate_proposal``, the protocol, the
quality contract, the noise floor, the coordinator's keep rule).

* :class:`LLMOrchestrator` is given the session's view
  (:func:`~inferloom.agents.llm_view.session_view`) and answers a
  :class:`ConfigProposal`. A call that gives nothing usable answers
  ``{"refused": {"rule", "why"}}``: the coordinator refuses it under that rule
  (``llm_schema_invalid``, ``llm_timeout``, ``llm_budget``, ...).
* :class:`LLMCritic` may only make a decision stricter: the rule critic rules
  first; only its keeps are shown to the LLM, which may turn them into a
  revert (with its lesson), never the other way. An LLM failure leaves the rule
  critic's ruling as it was, with the refusal named in the output.

Each output carries ``llm_calls`` (tokens, latency, cost of each call), which
the coordinator writes to the ledger with the agent's output.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field

from inferloom.agents.llm_client import LLMClient
from inferloom.agents.llm_record import LLMRefusal
from inferloom.agents.llm_view import session_view, view_text
from inferloom.agents.rules import RuleCritic
from inferloom.measure.records import Evidence

__all__ = ["ConfigProposal", "CriticRuling", "LLMOrchestrator", "LLMCritic", "ORCHESTRATOR_SYSTEM",
           "CRITIC_SYSTEM"]

Scalar = bool | int | float | str


class ConfigProposal(BaseModel):
    """The orchestrator's answer."""

    model_config = ConfigDict(extra="forbid")
    action: Literal["try_config", "end_phase"]
    changes: dict[str, Scalar] = Field(default_factory=dict, description="knob -> value, relative to the stack")
    predicted_gain: float | None = Field(None, ge=-1.0, le=100.0, description="relative throughput gain (0.1 = +10%)")
    rationale: str = Field(min_length=1, max_length=2000)


class CriticRuling(BaseModel):
    """The critic's answer."""

    model_config = ConfigDict(extra="forbid")
    decision: Literal["keep", "revert"]
    lesson: str = Field(min_length=1, max_length=500)


ORCHESTRATOR_SYSTEM = (
    "You are the orchestrator of inferloom, an inference optimizer. You propose the next serving configuration "
    "to measure; inferloom measures it itself (interleaved pairs against the current stack, a bootstrap interval, "
    "a quality contract) and keeps it only if it is proven faster and still correct. You never measure and never "
    "decide a keep. Propose changes relative to the current stack, using only knobs of knob_space with values in "
    "their domains, a configuration not measured before (see trials), one or two knobs at a time so that a gain "
    "is attributable. Use the profile, the roofline and the lessons of rejected trials. Answer end_phase when "
    "nothing is worth trying. Answer only with the JSON object of the schema.")

CRITIC_SYSTEM = (
    "You are the critic of inferloom. A candidate passed the measurement protocol, the quality contract and the "
    "noise floor, and the rule critic would keep it. You may only make this decision stricter: answer revert "
    "(with a one-line lesson saying why) if the evidence is suspect (e.g. a gain larger than the profile or the "
    "roofline allows, an interval too wide to trust, a change that should not affect speed), else keep. You "
    "cannot keep anything the rules reverted. Answer only with the JSON object of the schema.")


class LLMOrchestrator:
    """Proposes the next configuration by asking the LLM (see the module docstring)."""

    name = "llm-orchestrator"

    def __init__(self, client: LLMClient) -> None:
        self.client = client

    def propose(self, state: Mapping[str, Any]) -> dict[str, Any]:
        user = ("The session so far (JSON):\n" + view_text(session_view(state)) +
                "\nPropose the next configuration to measure, or end_phase.")
        try:
            answer, calls = self.client.ask("orchestrator", ORCHESTRATOR_SYSTEM, user, ConfigProposal)
        except LLMRefusal as exc:
            return {"refused": {"rule": exc.rule, "why": exc.why}, "llm_calls": exc.calls}
        out: dict[str, Any] = {"action": answer.action, "rationale": f"LLM: {answer.rationale}", "llm_calls": calls}
        if answer.action == "try_config":
            out.update(changes=dict(answer.changes), predicted_gain=answer.predicted_gain, source="llm")
        return out


def _evidence_dict(evidence: Evidence | Mapping[str, Any]) -> dict[str, Any]:
    """The evidence's ledger form (a typed record's, or the dict handed over as is)."""
    return evidence.as_dict() if isinstance(evidence, Evidence) else dict(evidence)


class LLMCritic:
    """Rules on one trial's evidence, only ever stricter than :class:`RuleCritic` (see the module docstring).

    ``view``: reads the session's state dict (from ``state.json``) for the prompt; None: the evidence alone."""

    name = "llm-critic"

    def __init__(self, client: LLMClient, view: Callable[[], Mapping[str, Any]] | None = None,
                 base: Any = None) -> None:
        self.client, self.view, self.base = client, view, base if base is not None else RuleCritic()

    def judge(self, evidence: Evidence | Mapping[str, Any]) -> dict[str, Any]:
        ruling = dict(self.base.judge(evidence))
        if ruling.get("decision") != "keep":
            return {**ruling, "llm": "not asked: the rule critic reverted, and an LLM may only make a decision stricter"}
        context = view_text(session_view(self.view())) if self.view is not None else "{}"
        user = (f"The evidence for this candidate (JSON):\n{json.dumps(_evidence_dict(evidence), default=str)}\n"
                f"The rule critic's ruling: {ruling.get('lesson')}\nThe session so far (JSON):\n{context}")
        try:
            answer, calls = self.client.ask("critic", CRITIC_SYSTEM, user, CriticRuling)
        except LLMRefusal as exc:
            return {**ruling, "llm_refusal": {"rule": exc.rule, "why": exc.why}, "llm_calls": exc.calls}
        if answer.decision == "revert":
            return {"decision": "revert", "lesson": f"LLM critic: {answer.lesson} (the rules would keep: "
                    f"{ruling.get('lesson')})", "llm_calls": calls}
        return {**ruling, "llm_calls": calls, "llm_lesson": answer.lesson}
