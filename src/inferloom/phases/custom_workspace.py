"""Binding a custom session at coordinator start (and resume): the workspace
(a clone; the user's checkout is only read), the stock and stack trees, the
protected files' checksums taken at stock, the sandbox the session's commands
run in, and the kept commits rebuilt from the ledger when the workspace was
lost."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from inferloom.patches.worktree import Workspace
from inferloom.phases.common import step_key as _key
from inferloom.phases.context import SessionContext
from inferloom.phases.custom_sources import patch_sources
from inferloom.phases.custom_stack import source_state, source_trees, workspace
from inferloom.sandbox import resolve as resolve_sandbox
from inferloom.session.manifest import read_manifest
from inferloom.session.state import SessionState, load_state, save_state
from inferloom.session.state_models import SourceState
from inferloom.workloads.base import AdapterError, SourceTrees
from inferloom.workloads.custom import git
from inferloom.workloads.protected import protected_patterns, take_protected

__all__ = ["PROTECTED", "SANDBOX", "bind_session"]

PROTECTED = "protected_files"  # ledger kind: the protected files' checksums, taken at session start
SANDBOX = "sandbox"  # ledger kind: whether the session's commands run sandboxed, and why not (inferloom.sandbox)


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
    adapter = source_trees(ctx)
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
    _sb, rec = resolve_sandbox(cu.sandbox, patches=bool(patch_sources(ctx)), network=cu.patches.command_network)
    ctx.ledger.append(SANDBOX, rec, key=_key("sandbox", st.session_id, rec["mode"], rec.get("patches")))
    ctx.progress(f"custom workload: sandbox {rec['mode']}" + (f" ({rec['reason']})" if rec.get("reason") else ""))

