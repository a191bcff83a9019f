"""Asking a custom session's patch sources for the next candidate: the one
given to the coordinator, else the spec's directory of patch files, then its
Specialist command (an LLM Specialist's calls go to the ledger like every
agent's). A source sees what was tried and kept so far; one that fails or has
nothing more is not asked again this session."""

from __future__ import annotations

from typing import Any

from inferloom.agents.llm_specialist import LLMPatchSource
from inferloom.patches.source import CommandPatchSource, DirectoryPatchSource, PatchCandidate, PatchSourceError
from inferloom.phases.common import step_key as _key
from inferloom.phases.context import SessionContext
from inferloom.phases.custom_stack import PATCH, source_state
from inferloom.sandbox import resolve as resolve_sandbox
from inferloom.session import ledger as L
from inferloom.session.state import SessionState

__all__ = ["patch_sources", "next_candidate"]


def patch_sources(ctx: SessionContext) -> list[Any]:
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


def next_candidate(ctx: SessionContext, st: SessionState) -> tuple[PatchCandidate | None, str]:
    """The next candidate from the first source that has one. A source that
    has nothing more, or that fails (recorded as a refusal, rule
    ``patch_source_failed``), is not asked again this session."""
    src = source_state(st)
    if src.failed_sources is None:
        src.failed_sources = []
    if src.exhausted_sources is None:
        src.exhausted_sources = []
    failed, done = src.failed_sources, src.exhausted_sources
    for source in patch_sources(ctx):
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

