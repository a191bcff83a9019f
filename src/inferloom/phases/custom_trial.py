"""A custom session's patch after gates (a)-(c): gate (d), applied in
``trees/candidate`` (the effect checked again on the staged tree), measured
against the stack by :func:`~inferloom.phases.trial.execute_trial` (paired,
quality-gated, kept only by the coordinator's rules, guarded by inferloom's
own clock: :mod:`inferloom.phases.custom_clock`), then kept as a commit on the
session branch or rejected with nothing left behind; and the refusal record
of a patch any gate refused."""

from __future__ import annotations

from typing import Any, Mapping

from inferloom.patches.effect import check_effect, staged_effect
from inferloom.patches.parse import PatchRefusal, parse_patch
from inferloom.patches.policy import PatchPolicy
from inferloom.phases.common import step_key as _key
from inferloom.phases.context import SessionContext
from inferloom.phases.custom_clock import clock_guard
from inferloom.phases.custom_stack import PATCH, source_state, workspace
from inferloom.phases.trial import execute_trial
from inferloom.session.state import SessionState
from inferloom.session.state_models import KeptCommit, Trial
from inferloom.workloads.custom import TREE_KEY
from inferloom.workloads.protected import PROTECTED_CHANGED

__all__ = ["refuse_patch", "patch_trial", "commit_message"]


def refuse_patch(ctx: SessionContext, st: SessionState, rule: str, why: str, cand: Mapping[str, Any], gate: str) -> None:
    """A refused patch: the coordinator's refusal (ledger, rule) plus its patch record.
    A refused file from a directory does not count toward the agent refusal limit."""
    before = st.extra.refusals_in_a_row or 0
    ctx.refuse(st, rule, f"patch {cand['id']}: {why}", {"changes": {"patch": cand["id"]}, "patch": cand},
              cand.get("agent", "patch-source"))
    st.extra.refusals_in_a_row = before
    st.extra.refusals_total = (st.extra.refusals_total or 0) + 1
    ctx.ledger.append(PATCH, {"id": cand["id"], "title": cand.get("title"), "gate": gate, "outcome": "refused",
                            "rule": rule, "why": why, "kept": False},
                    key=_key("patch-outcome", st.session_id, cand["id"], cand.get("sha256")))
    ctx.progress(f"  patch {cand['id']} refused at gate {gate} ({rule})")


def _patch_outcome(p: Mapping[str, Any], trial: Trial, q: Mapping[str, Any]) -> dict[str, Any]:
    """A measured patch's ledger record: a view of its trial record plus the quality gate's rule."""
    out = {"id": p["id"], "title": p["title"], "gate": "measure", "trial": trial.trial,
           "outcome": trial.verdict, "kept": trial.kept, "ratio": trial.ratio,
           "ci_low": trial.ci_low, "ci_high": trial.ci_high,
           "quality_rule": q.get("rule"), "quality_failed": q.get("failed", []),
           "measurement_seq": trial.measurement_seq, "verdict_seq": trial.verdict_seq}
    if q.get("rule"):
        out["rule"] = q["rule"]
    return out


def commit_message(pid: str, title: str, ratio: float, lo: float, hi: float) -> str:
    """A kept patch's commit message: its id, title, and measured gain with its interval."""
    return (f"inferloom KEEP {pid}: {title} ({(ratio - 1) * 100:+.1f}% "
            f"[{(lo - 1) * 100:+.1f}, {(hi - 1) * 100:+.1f}])")


def patch_trial(ctx: SessionContext, st: SessionState, p: Mapping[str, Any]) -> None:
    """Gate (d): apply in trees/candidate, measure against the stack, keep or reject."""
    src = source_state(st)
    key = p["key"]
    ws = workspace(ctx, st)
    prop = ctx.ledger.find(key + ":proposal") or {}
    summary = {**(prop.get("patch") or {}), "id": p["id"], "title": p["title"], "sha256": p["sha256"]}
    pol = ctx.spec.custom.patches
    try:
        tree = ws.apply("candidate", src.stack, p["id"], prop.get("text") or "")
        # the tree to be measured is the tree that was judged: git's effect, checked again where it landed
        check_effect(parse_patch((prop.get("text") or "").encode(), max_bytes=pol.max_bytes, max_files=pol.max_files,
                                 max_changed_lines=pol.max_changed_lines), staged_effect(tree),
                     PatchPolicy.from_spec(ctx.spec.custom), max_files=pol.max_files,
                     max_changed_lines=pol.max_changed_lines)
    except PatchRefusal as r:
        st.pending_action = None
        refuse_patch(ctx, st, r.rule, r.why, summary, "apply")
        ws.remove("candidate")
        return
    proposal = {"action": "try_config", "changes": {"patch": p["id"]}, "config": {**st.stack, TREE_KEY: str(tree)},
                "predicted_gain": p.get("expected_gain"), "source": "patch", "rationale": p.get("hypothesis")}
    clock: dict[str, Any] = {}
    trial = execute_trial(ctx, st, proposal, key, agent=p.get("agent"), guard=clock_guard(ctx, key, p["id"], clock))
    # the tree is not part of any configuration the state keeps
    st.stack = {k: v for k, v in st.stack.items() if k != TREE_KEY}
    trial.config = {k: v for k, v in trial.config.items() if k != TREE_KEY}
    if st.measured_config_keys and TREE_KEY in st.measured_config_keys[-1]:
        st.measured_config_keys.pop()
    meas = ctx.ledger.find(key + ":measurement") or {}
    q = meas.get("quality") or {}
    outcome = _patch_outcome(p, trial, q)
    if clock:
        outcome["clock"] = clock
        if clock.get("rule") and trial.verdict == clock["rule"]:
            outcome["rule"] = clock["rule"]
    if meas.get("error_kind") == PROTECTED_CHANGED or PROTECTED_CHANGED in str(meas.get("error") or ""):
        outcome["rule"] = PROTECTED_CHANGED
        ctx.record_refusal(st, PROTECTED_CHANGED, f"patch {p['id']}: {meas.get('error')}", "coordinator",
                           {"changes": {"patch": p["id"]}}, key + ":protected")
    if trial.kept:
        msg = commit_message(p["id"], p["title"], trial.ratio, trial.ci_low, trial.ci_high)
        sha = ws.commit("candidate", msg)
        ws.publish(src.branch, sha)
        src.kept.append(KeptCommit(id=p["id"], sha=sha, title=p["title"], message=msg, verdict_seq=trial.verdict_seq,
                                   proposal_key=key + ":proposal", parent=src.stack))
        src.stack = sha
        trial.commit = sha
        outcome["commit"] = sha
        ws.tree("stack", sha)
        ctx.progress(f"  patch {p['id']} kept: commit {sha[:10]} on branch {src.branch}")
    else:
        ctx.progress(f"  patch {p['id']} rejected ({trial.verdict}"
                   + (f", {outcome['rule']}" if outcome.get("rule") else "") + "): no commit, tree removed")
    ctx.ledger.append(PATCH, outcome, key=key + ":outcome")
    ws.remove("candidate")
    st.pending_action = None
