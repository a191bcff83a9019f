"""One trial, written once: proposal -> ledger PROPOSAL entry ->
``pending_action`` -> save -> paired measurement against the stack -> a fresh
Critic's ruling -> the coordinator's verdict -> state update.

Every phase that measures a change goes through here: the warm replay
(PRELUDE), the configuration search (FRAMEWORK), kernel candidates (KERNEL)
and source patches (a custom workload's FRAMEWORK). The coordinator, not an
agent, keeps or reverts: a change is kept only when the protocol keeps it,
the quality contract passes, the gain clears the minimum gain and the A/A
noise floor together (:func:`inferloom.measure.keep_rule.session_keep`), and
the Critic agrees: :func:`inferloom.measure.keep_rule.decide` says so from the
typed :class:`~inferloom.measure.records.Evidence` of the measurement's
:class:`~inferloom.measure.records.Comparison`, both serialized only into the
ledger. :func:`trial_record` builds the trial record that
``state.json`` keeps; the ledger's verdict entry and a patch's outcome are
views of it.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

from inferloom.measure.keep_rule import aa_floor, decide
from inferloom.measure.protocol import with_prior
from inferloom.patches.critic import RulePatchCritic
from inferloom.patches.parse import PatchRefusal
from inferloom.phases.common import jsonable, seed_base
from inferloom.measure.compare import compare, reference_sets, stock_references
from inferloom.measure.records import Comparison, Evidence, PairedDecision
from inferloom.phases.context import SessionContext
from inferloom.phases.roofline import kept_roofline
from inferloom.session import ledger as L
from inferloom.session.state import PendingAction, SessionState
from inferloom.session.state_models import Trial
from inferloom.workloads.base import BudgetedStarts, config_key

__all__ = ["Guard", "noise_floor_gain", "propose", "begin", "run_trial", "execute_trial", "trial_record",
           "verdict_entry", "patch_critic"]

# A last check before a keep: (rule, why) turns the keep into outcome ``rule`` (keep_rule.decide's ``guarded``).
Guard = Callable[[Evidence], "tuple[str, str] | None"]


def noise_floor_gain(st: SessionState) -> float:
    """The A/A floor as a relative gain (:func:`inferloom.measure.keep_rule.aa_floor`): how far stock
    measured against a second instance of itself landed from 1. A true no-op measures as that much by
    instance effects alone (seen on an H200: -6%), so a kept gain's lower bound must clear it on top of
    ``min_gain``. Random noise is already in each trial's own interval; this floor is for the systematic
    part. 0.0 when no A/A was measured."""
    return aa_floor(st.noise_floor)


def propose(ctx: SessionContext, st: SessionState, proposal: Mapping[str, Any], key: str, *, agent: str,
            **extra: Any) -> None:
    """The ledger's PROPOSAL entry for the next trial (``extra``: fields a phase adds)."""
    ctx.ledger.append(L.PROPOSAL, {"agent": agent, "cycle": st.cycle, "trial": len(st.trials) + 1,
                                   "changes": proposal["changes"], "config": proposal["config"],
                                   "predicted_gain": proposal.get("predicted_gain"),
                                   "source": proposal.get("source"), "rationale": proposal.get("rationale"), **extra},
                      key=key + ":proposal")


def begin(ctx: SessionContext, st: SessionState, action: str, key: str, params: Mapping[str, Any]) -> None:
    """Record the trial as ``pending_action`` and save, before anything is measured (resume finishes it)."""
    st.pending_action = PendingAction(action=action, params=dict(params), key=key)
    ctx.save(st)


def run_trial(ctx: SessionContext, st: SessionState, proposal: Mapping[str, Any], key: str, *, action: str,
              agent: str | None = None, entry: Mapping[str, Any] | None = None, min_ratio: float | None = None,
              guard: Guard | None = None) -> Trial:
    """The whole trial: proposal entry, pending action, save, then :func:`execute_trial`.
    ``entry``: extra fields of the PROPOSAL entry. Returns the trial record."""
    propose(ctx, st, proposal, key, agent=agent or ctx.agents.orchestrator.name, **dict(entry or {}))
    begin(ctx, st, action, key, jsonable(proposal))
    return execute_trial(ctx, st, proposal, key, agent=agent, min_ratio=min_ratio, guard=guard)


def execute_trial(ctx: SessionContext, st: SessionState, proposal: Mapping[str, Any], key: str, *,
                  agent: str | None = None, min_ratio: float | None = None, guard: Guard | None = None) -> Trial:
    """Measure a proposal against the stack, have a fresh Critic rule, keep or
    revert, and record it (ledger and state). ``min_ratio``: a keep also needs
    the measured ratio to reach it (warm replay). ``guard(evidence)``: a last
    check before a keep; ``(rule, why)`` turns the keep into outcome ``rule``
    (e.g. a gain larger than Amdahl's law allows). Returns the trial record."""
    agent = agent or ctx.agents.orchestrator.name
    n = len(st.trials) + 1
    base, cand = dict(st.stack), dict(proposal["config"])
    changes = dict(proposal["changes"])
    left = st.budget.minutes * 60 - st.used.elapsed_s
    ctx.progress(f"{st.phase.value} cycle {st.cycle}, trial {n}/{st.budget.trials}: "  # KERNEL's trials too
                 f"{', '.join(f'{k}={v}' for k, v in changes.items())}  "
                 f"(best so far x{_best(st):.3f} vs stock; {max(0.0, left) / 60:.1f} min left)")
    refs = stock_references(ctx.adapter, ctx.spec, st.stock_config, reference_sets(ctx.adapter, ("eval",)), ctx.refs,
                            ctx.progress)
    with budgeted_starts(ctx, st):  # a server start the budget cuts fails with kind "budget"
        entry, mseq = ctx.measured(key + ":measurement", L.MEASUREMENT, lambda: {
            "action": "try_config", "trial": n, "cycle": st.cycle, "changes": changes, **compare(
                ctx.adapter, ctx.spec, base, cand, settings=with_prior(ctx.settings, st.noise_floor),
                seed_base=seed_base(ctx.spec.seed, n), refs=refs,
                quality_sets=("eval",), progress=ctx.progress, labels=("stack", "candidate"),
                quality_floor=(st.noise_floor or {}).get("quality")).as_dict()})
    res = Comparison.from_dict(entry)  # the ledger's entry: this measurement's, or a resumed session's
    evidence = Evidence.of(res, changes=changes, noise_floor=noise_floor_gain(st), min_gain=ctx.settings.min_gain)
    critic = ctx.agents.critic_factory()  # fresh for every decision: no memory of earlier turns
    try:
        ruling = critic.judge(evidence)
    except Exception as exc:  # noqa: BLE001
        ruling = {"error": f"{type(exc).__name__}: {exc}"}
    ctx.ledger.append(L.AGENT_IO, {"agent": critic.name, "role": "critic", "input": evidence.as_dict(),
                                   "output": jsonable(ruling)}, key=key + ":critic")
    failed = ruling.get("llm_refusal") if isinstance(ruling, Mapping) else None
    if isinstance(failed, Mapping):  # the LLM critic failed: the decision stands as the rules made it
        ctx.record_refusal(st, str(failed.get("rule")), f"{failed.get('why')}; the decision stands as the protocol "
                           f"and the rule critic made it ({ruling.get('decision')})", critic.name,
                           {"changes": changes, "decision": ruling.get("decision")}, key + ":critic-llm")
    verdict = decide(evidence, ruling, min_ratio=min_ratio)
    if verdict.refusal is not None:
        ctx.refuse(st, verdict.refusal[0], verdict.refusal[1], ruling, critic.name)
    guarded = guard(evidence) if verdict.kept and guard is not None else None
    if guarded:
        verdict = decide(evidence, ruling, min_ratio=min_ratio, guarded=guarded)
        ctx.record_refusal(st, guarded[0], guarded[1], "coordinator", {"changes": changes, "ratio": evidence.ratio},
                           key + ":guard")
    keep, outcome, lesson = verdict.kept, verdict.outcome, verdict.lesson
    record = trial_record(n=n, cycle=st.cycle, changes=changes, config=cand, outcome=outcome, kept=keep,
                          decision=res.decision, quality_passed=evidence.quality_passed, proposal=proposal,
                          agent=agent, lesson=lesson, measurement_seq=mseq)
    record.verdict_seq = ctx.ledger.append(L.VERDICT, verdict_entry(record, res.verdict), key=key + ":verdict")
    record.finished_at = time.time()
    st.trials.append(record)
    st.measured_config_keys.append(config_key(cand))
    st.used.trials += 1
    if keep:
        st.stack = cand
        st.extra.stack_ratio = _best(st) * float(evidence.ratio)
        kept_roofline(ctx, st, entry, key, record)
    st.pending_action = None
    ctx.progress(f"  -> {outcome}: {lesson}")
    return record


def trial_record(*, n: int, cycle: int, changes: dict[str, Any], config: dict[str, Any], outcome: str,
                 kept: bool, decision: PairedDecision | Mapping[str, Any], quality_passed: bool | None,
                 proposal: Mapping[str, Any], agent: str, lesson: str, measurement_seq: int) -> Trial:
    """The trial as ``state.json`` keeps it (the one place a :class:`Trial` is
    built; ``verdict_seq`` and ``finished_at`` are set once the verdict is written).
    ``decision``: the protocol's last look (a mapping: its ledger form)."""
    d = decision if isinstance(decision, PairedDecision) else PairedDecision.from_dict(decision)
    return Trial(trial=n, cycle=cycle, changes=changes, config=config, verdict=outcome, kept=kept,
                 ratio=d.ratio, ci_low=d.ci_low, ci_high=d.ci_high, n_pairs=d.n_pairs, quality_passed=quality_passed,
                 predicted_gain=proposal.get("predicted_gain"), source=proposal.get("source"), agent=agent,
                 lesson=lesson, measurement_seq=measurement_seq, verdict_seq=None, finished_at=None)


def verdict_entry(record: Trial, protocol_verdict: Any) -> dict[str, Any]:
    """The ledger's VERDICT entry for a trial record."""
    return {"trial": record.trial, "cycle": record.cycle, "agent": record.agent, "changes": record.changes,
            "config": record.config, "outcome": record.verdict, "kept": record.kept, "lesson": record.lesson,
            "protocol_verdict": protocol_verdict, "ratio": record.ratio, "ci_low": record.ci_low,
            "ci_high": record.ci_high, "quality_passed": record.quality_passed,
            "predicted_gain": record.predicted_gain, "measurement_seq": record.measurement_seq}


def _best(st: SessionState) -> float:
    return float(st.extra.stack_ratio if st.extra.stack_ratio is not None else 1.0)


def patch_critic(ctx: SessionContext, cand: Any, parsed: Any, key: str) -> None:
    """A fresh patch critic (the agents' factory, else the rule critic) rules on one parsed patch; its exchange
    is recorded under ``key``; anything but a sign-off raises :class:`~inferloom.patches.parse.PatchRefusal`
    with the critic's rule (a critic that crashes is a refusal: fail-closed)."""
    critic = (ctx.agents.patch_critic_factory or RulePatchCritic)()
    evidence = {"id": cand.id, "title": cand.title, "hypothesis": cand.hypothesis, "paths": parsed.paths,
                "diff": parsed.to_dict()}
    try:
        ruling = critic.review(evidence)
    except Exception as exc:  # noqa: BLE001 - a crashing critic is a refusal, fail-closed
        ruling = {"decision": "refuse", "rule": "critic_error", "why": f"{type(exc).__name__}: {exc}"}
    ctx.ledger.append(L.AGENT_IO, {"agent": critic.name, "role": "patch-critic", "input": evidence,
                                   "output": jsonable(ruling)}, key=key + ":patch-critic")
    if not isinstance(ruling, Mapping) or ruling.get("decision") != "sign_off":
        rule = ruling.get("rule") if isinstance(ruling, Mapping) and ruling.get("rule") else "critic_refused"
        raise PatchRefusal(str(rule), str(ruling.get("why") if isinstance(ruling, Mapping) else ruling))


@contextmanager
def budgeted_starts(ctx: SessionContext, st: SessionState) -> Iterator[None]:
    """Within it, an adapter that starts servers (:class:`~inferloom.workloads.base.BudgetedStarts`) bounds
    each start by the seconds the session's budget has left (``workloads.server_start.budgeted_timeout``)."""
    if not isinstance(ctx.adapter, BudgetedStarts):
        yield
        return
    ctx.adapter.start_budget = lambda: st.budget.minutes * 60 - ctx.elapsed_s(st)
    try:
        yield
    finally:
        ctx.adapter.start_budget = None
