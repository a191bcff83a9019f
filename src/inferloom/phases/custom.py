"""Custom workloads in a session: the source stack and the patch pipeline.

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

CLOSE (:mod:`inferloom.phases.custom_close`): the final stack against stock
(each in its own tree) and the rollback drill.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from inferloom.agents.llm_specialist import LLMPatchSource
from inferloom.patches.critic import RulePatchCritic
from inferloom.patches.effect import check_effect, scratch_effect, staged_effect
from inferloom.patches.parse import PatchRefusal, parse_patch
from inferloom.patches.policy import PatchPolicy, check_policy
from inferloom.patches.source import CommandPatchSource, DirectoryPatchSource, PatchCandidate, PatchSourceError
from inferloom.patches.worktree import Workspace
from inferloom.phases.common import jsonable as _jsonable
from inferloom.phases.common import step_key as _key
from inferloom.phases.context import SessionContext
from inferloom.phases.framework import framework_step
from inferloom.phases.custom_clock import clock_guard
from inferloom.phases.trial import begin, execute_trial, propose
from inferloom.sandbox import resolve as resolve_sandbox
from inferloom.session import ledger as L
from inferloom.session.manifest import read_manifest
from inferloom.session.state import SessionState, load_state, save_state
from inferloom.session.state_models import KeptCommit, SourceState, Trial
from inferloom.workloads.base import AdapterError, SourceTrees
from inferloom.workloads.custom import TREE_KEY, git
from inferloom.workloads.protected import PROTECTED_CHANGED, protected_patterns, take_protected

__all__ = ["PATCH", "PROTECTED", "SANDBOX", "bind_session", "patch_framework_step", "workspace", "source_state",
           "commit_message"]

PATCH = "patch"  # ledger kind: one patch's outcome (gate reached, rule, commit)
PROTECTED = "protected_files"  # ledger kind: the protected files' checksums, taken at session start
SANDBOX = "sandbox"  # ledger kind: whether the session's commands run sandboxed, and why not (inferloom.sandbox)


def _trees(ctx: SessionContext) -> SourceTrees:
    """The adapter as a source-tree workload (a custom workload's adapter always is one)."""
    if not isinstance(ctx.adapter, SourceTrees):
        raise TypeError(f"a custom workload needs an adapter with source trees (default_tree, results_dir); "
                        f"got {type(ctx.adapter).__name__}")
    return ctx.adapter


def source_state(st: SessionState) -> SourceState:
    """The session's source stack (:func:`bind_session` records it before anything else runs)."""
    if st.extra.source is None:
        raise AdapterError("a custom workload's state.json has no source stack (extra.source): it was edited or "
                           "written by a different inferloom; start a new session", kind="workspace")
    return st.extra.source


def workspace(ctx: SessionContext, st: SessionState) -> Workspace:
    return Workspace(ctx.dir / "workspace", ctx.spec.custom.repo, date=source_state(st).date)


def _stock_sha(ctx: SessionContext) -> str:
    try:
        head = ((read_manifest(ctx.dir).get("adapter") or {}).get("source") or {}).get("head")
    except Exception:  # noqa: BLE001 - no manifest (a bare coordinator in a test): the adapter's own head
        head = None
    return head or ctx.adapter.head


def bind_session(ctx: SessionContext) -> None:
    """At coordinator start (and resume): the workspace, the stock and stack
    trees, and the adapter's default tree (= the stack). Rebuilds the kept
    commits from the ledger when the workspace was lost. The knowledge base is
    off (its recipes key on models; a custom workload is the user's code)."""
    adapter = _trees(ctx)
    st = load_state(ctx.dir)
    if st.extra.source is None:
        stock = _stock_sha(ctx)
        st.extra.source = SourceState(stock=stock, branch=f"inferloom/{st.session_id}", date=int(st.created_at),
                                      kept=[], seen=[], stack=stock)
        save_state(ctx.dir, st)
    src = source_state(st)
    ws = workspace(ctx, st)
    ctx.progress(f"custom workload: workspace {ws.root} (a clone; {ctx.spec.custom.repo} is only read)")
    dirty = git("--no-optional-locks", "status", "--porcelain", "--untracked-files=no", cwd=ctx.spec.custom.repo,
                check=False).stdout.strip()
    if dirty:
        ctx.progress(f"custom workload: WARNING: {ctx.spec.custom.repo} has uncommitted changes; they are not part of "
                   f"the session (stock is commit {src.stock[:10]}): commit them and start again to include them")
    if ctx.kb_url:
        ctx.options = replace(ctx.options, kb_url=None)
        ctx.progress("custom workload: knowledge base off (its recipes key on models; a custom workload is your code)")
    _record_sandbox(ctx, st)
    ws.ensure_clone()
    stale = ws.clear_stale_locks()
    if stale:
        ctx.progress(f"custom workload: removed lock files a killed run left in the clone: {', '.join(stale)}")
    ws.fetch_from_user(src.stock)
    if not ws.has_commit(src.stack):
        _rebuild(ctx, st, ws)
    _bind_protected(ctx, st, adapter, ws.tree("stock", src.stock))
    adapter.default_tree = ws.tree("stack", src.stack)
    adapter.results_dir = ws.root / "results"  # outside every tree
    ctx.progress(f"custom workload: stock {src.stock[:10]}, stack {src.stack[:10]} "
               f"({len(src.kept)} kept commit(s) on branch {src.branch})")


def _bind_protected(ctx: SessionContext, st: SessionState, adapter: SourceTrees, stock_tree: Path) -> None:
    """The protected files' checksums, from stock's commit (the user's HEAD), read
    in the fresh ``trees/stock`` before anything ran in it; taken once (state and
    ledger keep them: a resume verifies the same ones)."""
    src = source_state(st)
    if src.protected is None:
        prot = take_protected(stock_tree, src.stock, protected_patterns(ctx.spec.custom))
        prot.ledger_seq = ctx.ledger.append(PROTECTED, prot.model_dump(), key=_key("protected-files", st.session_id))
        src.protected = prot
        ctx.save(st)
        ctx.progress(f"custom workload: {len(prot.files)} protected file(s) checksummed at stock "
                     f"({', '.join(f.path for f in prot.files[:6])}{', ...' if len(prot.files) > 6 else ''}); "
                     "verified before every run")
    adapter.protected = src.protected


def _rebuild(ctx: SessionContext, st: SessionState, ws: Workspace) -> None:
    src = source_state(st)
    ctx.progress(f"custom workload: rebuilding {len(src.kept)} kept commit(s) from the ledger")
    sha = src.stock
    for k in src.kept:
        prop = ctx.ledger.find(k.proposal_key)
        if prop is None or not prop.get("text"):
            raise AdapterError(f"cannot rebuild kept patch {k.id}: its text is not in the ledger; the session's "
                               "workspace can't be reconstructed: start a new session", kind="workspace")
        ws.apply("candidate", sha, k.id, prop["text"])
        sha = ws.commit("candidate", k.message)
        if sha != k.sha:
            raise AdapterError(f"rebuilt commit {sha[:10]} of patch {k.id} differs from the recorded "
                               f"{k.sha[:10]} (was the ledger edited?); start a new session", kind="workspace")
    ws.remove("candidate")
    ws.publish(src.branch, sha)


def _record_sandbox(ctx: SessionContext, st: SessionState) -> None:
    """The sandbox the session's commands run in, in the ledger (the report shows
    it); refuses (exit 2) when patches would run and bubblewrap can't."""
    cu = ctx.spec.custom
    _sb, rec = resolve_sandbox(cu.sandbox, patches=bool(_sources(ctx)), network=cu.patches.command_network)
    ctx.ledger.append(SANDBOX, rec, key=_key("sandbox", st.session_id, rec["mode"], rec.get("patches")))
    ctx.progress(f"custom workload: sandbox {rec['mode']}" + (f" ({rec['reason']})" if rec.get("reason") else ""))


def _sources(ctx: SessionContext) -> list[Any]:
    """The patch sources, in the order they are asked: the one given to the
    coordinator, else the directory's files, then the Specialist command."""
    src = ctx.agents.patch_source
    if src is not None:
        return [src]
    pol = ctx.spec.custom.patches
    out: list[Any] = [DirectoryPatchSource(pol.dir)] if pol.dir else []
    if pol.command:
        sandbox, _rec = resolve_sandbox(ctx.spec.custom.sandbox, patches=True, network=pol.command_network)
        out.append(CommandPatchSource(pol.command, pol.command_timeout_s, sandbox=sandbox,
                                      network=pol.command_network))
    return out


def _source_view(ctx: SessionContext, st: SessionState) -> dict[str, Any]:
    """What a patch source sees: ids tried, every patch's outcome so far, the
    checkout and the patches kept (the current code is the checkout with them
    applied in order), and the objective."""
    src = source_state(st)
    outcomes = [{k: e.get(k) for k in ("id", "title", "gate", "outcome", "rule", "why", "kept", "ratio", "ci_low",
                                       "ci_high")} for e in ctx.ledger.entries(PATCH)]
    kept = []
    for k in src.kept:
        prop = ctx.ledger.find(k.proposal_key) or {}
        kept.append({"id": k.id, "title": k.title, "commit": k.sha, "diff": prop.get("text")})
    cu = ctx.spec.custom
    return {"patches_seen": list(src.seen), "outcomes": outcomes, "kept": kept, "checkout": cu.repo,
            "entrypoint": list(cu.entrypoint), "objective": cu.objective, "higher_is_better": cu.higher_is_better,
            "policy": {"allowlist": list(cu.patches.allowlist), "forbidden_patterns": list(cu.patches.forbidden_patterns)}}


def _next_candidate(ctx: SessionContext, st: SessionState) -> tuple[PatchCandidate | None, str]:
    """The next candidate from the first source that has one. A source that
    has nothing more, or that fails (recorded as a refusal, rule
    ``patch_source_failed``), is not asked again this session."""
    src = source_state(st)
    if src.failed_sources is None:
        src.failed_sources = []
    if src.exhausted_sources is None:
        src.exhausted_sources = []
    failed, done = src.failed_sources, src.exhausted_sources
    for source in _sources(ctx):
        name = getattr(source, "name", "patch-source")
        if name in failed or name in done:
            continue
        try:
            cand = source.next_patch(_source_view(ctx, st))
        except PatchSourceError as exc:
            _llm_io(ctx, st, source, None)
            failed.append(name)
            ctx.record_refusal(st, "patch_source_failed", f"{name}: {exc}; not asked again this session", name,
                             {"source": name}, _key("patch-source-failed", st.session_id, name))
            ctx.save(st)
            continue
        _llm_io(ctx, st, source, cand)
        if cand is not None:
            return cand, name
        done.append(name)
        ctx.progress(f"patch source {name}: nothing more to propose")
        ctx.save(st)
    return None, ""


def _llm_io(ctx: SessionContext, st: SessionState, source: Any, cand: PatchCandidate | None) -> None:
    """An LLM Specialist's calls (tokens, latency, cost) in the ledger, like every agent's."""
    if isinstance(source, LLMPatchSource) and source.last_calls:
        ctx.ledger.append(L.AGENT_IO, {"agent": source.name, "role": "specialist",
                                       "output": {"patch": cand.summary() if cand else None,
                                                  "llm_calls": source.last_calls}},
                          key=_key("specialist-io", st.session_id, source.last_calls[0].get("n")))
        source.last_calls = []


def _refuse_patch(ctx: SessionContext, st: SessionState, rule: str, why: str, cand: Mapping[str, Any], gate: str) -> None:
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


def patch_framework_step(ctx: SessionContext, st: SessionState) -> None:
    """One FRAMEWORK tick of a custom workload: the next source patch while a
    source has one, then the configuration search."""
    _trees(ctx).default_tree = ctx.dir / "workspace" / "trees" / "stack"
    if st.pending_action is not None and st.pending_action.action == "try_patch":
        _trial(ctx, st, dict(st.pending_action.params))
        return
    cand, agent = _next_candidate(ctx, st)
    if cand is None:
        framework_step(ctx, st)
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
        critic = (ctx.agents.patch_critic_factory or RulePatchCritic)()
        evidence = {"id": cand.id, "title": cand.title, "hypothesis": cand.hypothesis, "paths": parsed.paths,
                    "diff": parsed.to_dict()}
        try:
            ruling = critic.review(evidence)
        except Exception as exc:  # noqa: BLE001 - a crashing critic is a refusal, fail-closed
            ruling = {"decision": "refuse", "rule": "critic_error", "why": f"{type(exc).__name__}: {exc}"}
        ctx.ledger.append(L.AGENT_IO, {"agent": critic.name, "role": "patch-critic", "input": evidence,
                                     "output": _jsonable(ruling)}, key=key + ":patch-critic")
        if not isinstance(ruling, Mapping) or ruling.get("decision") != "sign_off":
            rule = ruling.get("rule") if isinstance(ruling, Mapping) and ruling.get("rule") else "critic_refused"
            raise PatchRefusal(str(rule), str(ruling.get("why") if isinstance(ruling, Mapping) else ruling))
    except PatchRefusal as r:
        _refuse_patch(ctx, st, r.rule, r.why, summary, gate)
        return
    st.extra.refusals_in_a_row = 0
    st.extra.add_proposal({"patch": cand.id})
    begin(ctx, st, "try_patch", key, {
        "id": cand.id, "title": cand.title, "sha256": cand.sha256, "expected_gain": cand.expected_gain,
        "hypothesis": cand.hypothesis, "agent": agent, "key": key})
    _trial(ctx, st, st.pending_action.params)


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
    return (f"inferloom KEEP {pid}: {title} ({(ratio - 1) * 100:+.1f}% "
            f"[{(lo - 1) * 100:+.1f}, {(hi - 1) * 100:+.1f}])")


def _trial(ctx: SessionContext, st: SessionState, p: Mapping[str, Any]) -> None:
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
        _refuse_patch(ctx, st, r.rule, r.why, summary, "apply")
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
