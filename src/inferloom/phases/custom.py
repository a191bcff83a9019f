"""Custom workloads in a session: the patch pipeline's FRAMEWORK tick and its gates (a)-(c).

The stack of a custom session is its configuration plus the commits kept so
far. ``state.extra.source`` (:class:`~inferloom.session.state_models.SourceState`)
records it (the source of truth, with the ledger)::

    {"stock": SHA, "branch": "inferloom/<session>", "date": INT,
     "kept": [{"id", "sha", "title", "message", "verdict_seq", "proposal_key", "parent"}],
     "seen": [patch ids handled], "stack": SHA, "failed_sources": [...], "exhausted_sources": [...]}

FRAMEWORK, one patch per tick while the :class:`PatchSource` has any, then
the ordinary configuration search: each candidate goes through the gates in
order, each refusing with a named rule that goes into the ledger (kind
``refusal``): (a) parse (:mod:`inferloom.patches.parse`), (b) policy (:mod:`inferloom.patches.policy`),
(b2) effect: applied by git to a scratch index, what git changed judged again
(:mod:`inferloom.patches.effect`), (c) the patch critic's sign-off
(:mod:`inferloom.patches.critic`), (d) applied in ``trees/candidate`` (rule
``does_not_apply``; the effect checked again on the staged tree) and measured against the stack by
:func:`~inferloom.phases.trial.execute_trial` (paired, quality-gated,
kept only by the coordinator's rules; every run first verifies the protected
files' checksums, taken from stock at session start: a mismatch fails the
trial with rule ``protected_file_changed``). A kept patch becomes a commit on the
session branch (message ``inferloom KEEP <id>: <title> (+12.3% [+9.1, +15.4])``),
published to the user's checkout as a branch; a rejected one leaves no commit,
branch or tree behind.

The rest, one module each: the source stack's accessors
(:mod:`~inferloom.phases.custom_stack`), binding the session at start
(:mod:`~inferloom.phases.custom_workspace`: workspace, trees, protected files,
sandbox), asking the patch sources (:mod:`~inferloom.phases.custom_sources`),
gate (d) and the keep (:mod:`~inferloom.phases.custom_trial`, with the clock
guard of :mod:`~inferloom.phases.custom_clock`), and CLOSE
(:mod:`~inferloom.phases.custom_close`): the final stack against stock (each
in its own tree) and the rollback drill.
"""

from __future__ import annotations

from inferloom.patches.effect import check_effect, scratch_effect
from inferloom.patches.parse import PatchRefusal, parse_patch
from inferloom.patches.policy import PatchPolicy, check_policy
from inferloom.patches.source import PatchCandidate
from inferloom.phases.common import step_key as _key
from inferloom.phases.context import SessionContext, Step
from inferloom.phases.custom_sources import next_candidate
from inferloom.phases.custom_stack import source_state, source_trees, workspace
from inferloom.phases.custom_trial import patch_trial, refuse_patch
from inferloom.phases.trial import begin, patch_critic, propose
from inferloom.session.state import SessionState

__all__ = ["patch_framework_step"]


def patch_framework_step(ctx: SessionContext, st: SessionState, config_search: Step) -> None:
    """One FRAMEWORK tick of a custom workload: the next source patch while a
    source has one, then ``config_search`` (the configuration search, as the
    coordinator wires it: :mod:`inferloom.phases.strategy`)."""
    source_trees(ctx).default_tree = ctx.dir / "workspace" / "trees" / "stack"
    if st.pending_action is not None and st.pending_action.action == "try_patch":
        patch_trial(ctx, st, dict(st.pending_action.params))
        return
    cand, agent = next_candidate(ctx, st)
    if cand is None:
        config_search(ctx, st)
        return
    _gates(ctx, st, cand, agent)


def _gates(ctx: SessionContext, st: SessionState, cand: PatchCandidate, agent: str) -> None:
    source_state(st).seen.append(cand.id)
    key = _key("try_patch", st.session_id, cand.id, cand.sha256)
    try:
        text: str | None = cand.data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    summary = {**cand.summary(), "agent": agent}
    ctx.progress(f"FRAMEWORK cycle {st.cycle}: patch {cand.id} ({cand.title}); gates: parse, policy, effect, critic, apply")
    propose(ctx, st, {"changes": {"patch": cand.id}, "config": st.stack, "predicted_gain": cand.expected_gain,
                    "source": "patch", "rationale": cand.hypothesis}, key, agent=agent, patch=summary,
            text=text if text is not None and len(text) <= 512 * 1024 else None)
    pol = ctx.spec.custom.patches
    gate = "parse"
    try:
        parsed = parse_patch(cand.data, max_bytes=pol.max_bytes, max_files=pol.max_files,
                             max_changed_lines=pol.max_changed_lines)
        gate = "policy"
        policy = PatchPolicy.from_spec(ctx.spec.custom)
        check_policy(parsed, policy, tree=ctx.dir / "workspace" / "trees" / "stack")
        gate = "effect"
        ws = workspace(ctx, st)
        check_effect(parsed, scratch_effect(ws.repo, source_state(st).stack, cand.data, ws.root / "scratch"), policy,
                     max_files=pol.max_files, max_changed_lines=pol.max_changed_lines)
        gate = "critic"
        patch_critic(ctx, cand, parsed, key)
    except PatchRefusal as r:
        refuse_patch(ctx, st, r.rule, r.why, summary, gate)
        return
    st.extra.refusals_in_a_row = 0
    st.extra.add_proposal({"patch": cand.id})
    begin(ctx, st, "try_patch", key, {
        "id": cand.id, "title": cand.title, "sha256": cand.sha256, "expected_gain": cand.expected_gain,
        "hypothesis": cand.hypothesis, "agent": agent, "key": key})
    patch_trial(ctx, st, st.pending_action.params)

