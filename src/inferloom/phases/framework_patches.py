"""FRAMEWORK's engine-patch step (``serving.engine_patches``, an engine with the
:class:`~inferloom.workloads.base.EnginePatches` hook: vLLM): the user's engine diffs, one per tick, each a
candidate measured end to end against the current stack like any change; then the configuration search.

The order is decided once (ledger ``engine_patch_order``, with how): by the server profile's share of what
each patch touches when the session has a profile of the server (``state.extra.profile.categories``; the
coarse file -> category map of ``vllm_engine_patches.rank_patches``), else file order, said so. Each
candidate goes through the patch pipeline's gates in order, a refusal naming its rule (a ``refusal`` and a
``patch`` ledger entry, the gate it stopped at): ``parse`` (:func:`~inferloom.patches.parse.parse_patch`),
``policy`` (:func:`~inferloom.patches.policy.check_policy` with the engine's policy: only the package's files,
``outside_allowlist`` for an upstream PR's ``csrc/`` or ``tests/``), ``critic`` (the patch critic's sign-off:
``no_hypothesis``, ``diff_outside_hypothesis``), ``isolated copy`` (the engine builds its copy-on-write
overlay of the installed package: ``does_not_apply`` on the installed version; the environment is never
written). A patch that passes is the knob change ``{engine_patch: NAME}`` measured by
:func:`~inferloom.phases.trial.execute_trial` (paired, interleaved, the quality contract, kept only by the
coordinator's rules); its ``patch`` entry carries the verdict and the overlay's digest. One engine patch per
stack (the knob has one value): a later patch is measured against the stack with the kept one, and replaces
it only by beating it. The rollback drill is CLOSE's (``close_engine``); the export writes the kept patch
(``patches/export.py``)."""

from __future__ import annotations

from typing import Any, Mapping

from inferloom.patches.parse import BINARY, MALFORMED, TOO_LARGE, PatchRefusal, parse_patch
from inferloom.patches.policy import check_policy
from inferloom.patches.source import DirectoryPatchSource, PatchCandidate, PatchSourceError
from inferloom.phases.common import step_key
from inferloom.phases.context import SessionContext, Step
from inferloom.phases.trial import begin, execute_trial, patch_critic, propose
from inferloom.session.state import SessionState
from inferloom.workloads.base import ConfigError, EnginePatches, config_key, resolve_config
from inferloom.workloads.engine_ladder import ENV_KNOB as LADDER_ENV
from inferloom.workloads.engine_ladder import PATCH_KNOB as LADDER_PATCH
from inferloom.workloads.vllm_engine_patches import patch_files, rank_patches

__all__ = ["engine_patch_step", "ORDER", "PATCH", "TRY", "AGENT", "patch_order"]

ORDER = "engine_patch_order"  # ledger kind: the order the patches are tried in, and how it was decided
PATCH = "patch"  # ledger kind: one patch's outcome (the gate it reached, its rule or verdict), as a custom session's
TRY = "try_engine_patch"
AGENT = "engine-patches"
_PARSE_RULES = (MALFORMED, BINARY, TOO_LARGE)


def _engine(ctx: SessionContext) -> EnginePatches:
    if not isinstance(ctx.adapter, EnginePatches):
        raise TypeError(f"serving.engine_patches needs an engine that takes source patches; "
                        f"{type(ctx.adapter).__name__} does not")
    return ctx.adapter


def _shares(st: SessionState) -> dict[str, float] | None:
    prof = st.extra.profile
    cats = prof.categories if prof is not None else None
    if not isinstance(cats, dict) or not cats:
        return None
    return {k: float(v.get("share", 0.0)) if isinstance(v, Mapping) else float(v) for k, v in cats.items()}


def patch_order(ctx: SessionContext, st: SessionState) -> dict[str, Any]:
    """The session's order (decided once, then read back from the ledger)."""
    key = step_key(ORDER, st.session_id)
    found = ctx.ledger.find(key)
    if found is not None:
        return found
    files = patch_files(ctx.spec.serving.engine_patches)
    touched: dict[str, list[str]] = {}
    for name, path in files.items():
        try:
            touched[name] = parse_patch(path.read_bytes()).changed_paths
        except (PatchRefusal, OSError):
            touched[name] = []  # its gates say why, in its turn
    shares = _shares(st)
    order, how = rank_patches(touched, shares)
    prof = st.extra.profile
    entry = {"order": order, "how": how, "profile_seq": prof.ledger_seq if shares and prof is not None else None,
             "directory": ctx.spec.serving.engine_patches}
    ctx.ledger.append(ORDER, entry, key=key)
    ctx.progress(f"FRAMEWORK: {len(order)} engine patch(es), {how}: " + ", ".join(
        r["id"] + ("" if r["share"] is None else f" ({float(r['share']) * 100:.1f}%)") for r in order))
    return ctx.ledger.find(key) or entry


def rung_stack(stock: Mapping[str, Any]) -> str | None:
    """``knob=value`` of the enablement rung (3-5) stock was recovered on, None when stock started as given."""
    return next((f"{k}={stock[k]}" for k in (LADDER_PATCH, LADDER_ENV) if str(stock.get(k, "none")) != "none"), None)


def engine_patch_step(ctx: SessionContext, st: SessionState, config_search: Step) -> None:
    """One FRAMEWORK tick: the next engine patch while one is left untried (and the budget lasts), then
    ``config_search``."""
    if st.pending_action is not None and st.pending_action.action == TRY:
        _measure(ctx, st, dict(st.pending_action.params))
        return
    rung = rung_stack(st.stock_config)
    if rung is not None:  # stock itself runs on an enablement rung's engine: no second source overlay over it
        key = step_key("engine-patches-skipped", st.session_id)
        if ctx.ledger.find(key) is None:
            why = (f"stock runs on the enablement ladder's {rung}; an engine patch's overlay of the installed package "
                   "would shadow it (two source overlays are not combined): the engine patches are not tried")
            ctx.ledger.append(ORDER, {"order": [], "how": "skipped", "why": why}, key=key)
            ctx.progress(f"FRAMEWORK: {why}")
        config_search(ctx, st)
        return
    done = {e.get("id") for e in ctx.ledger.entries(PATCH)}
    nxt = next((r for r in patch_order(ctx, st)["order"] if r["id"] not in done), None)
    if nxt is None or ctx.budget_reason(st):
        config_search(ctx, st)
        return
    path = patch_files(ctx.spec.serving.engine_patches).get(nxt["id"])
    try:
        if path is None:
            raise PatchSourceError(f"patch {nxt['id']}: its file left serving.engine_patches during the session")
        cand = DirectoryPatchSource(path.parent).load(path)
    except PatchSourceError as exc:
        _refuse(ctx, st, {"id": nxt["id"], "title": nxt["id"]}, "patch_unreadable", str(exc), "read")
        return
    _gates(ctx, st, cand)


def _refuse(ctx: SessionContext, st: SessionState, cand: Mapping[str, Any], rule: str, why: str, gate: str) -> None:
    """A refused patch: the coordinator's refusal (rule) and its ``patch`` entry; a refused file does not count
    toward the agents' refusal limit."""
    before = st.extra.refusals_in_a_row or 0
    ctx.refuse(st, rule, f"engine patch {cand['id']}: {why}", {"changes": {"engine_patch": cand["id"]}, "patch": cand},
               AGENT)
    st.extra.refusals_in_a_row = before
    st.extra.refusals_total = (st.extra.refusals_total or 0) + 1
    ctx.ledger.append(PATCH, {"id": cand["id"], "title": cand.get("title"), "gate": gate, "outcome": "refused",
                              "rule": rule, "why": why, "kept": False, "engine": True},
                      key=step_key("engine-patch-outcome", st.session_id, cand["id"], cand.get("sha256")))
    ctx.progress(f"  engine patch {cand['id']} refused at gate {gate} ({rule}): {why[:160]}")


def _gates(ctx: SessionContext, st: SessionState, cand: PatchCandidate) -> None:
    engine = _engine(ctx)
    knob = engine.engine_patch_knob
    key = step_key(TRY, st.session_id, cand.id, cand.sha256)
    summary = {**cand.summary(), "agent": AGENT}
    text = cand.data.decode("utf-8", errors="replace")
    ctx.progress(f"FRAMEWORK cycle {st.cycle}: engine patch {cand.id} ({cand.title}); gates: parse, policy, critic, "
                 "isolated copy")
    propose(ctx, st, {"changes": {knob: cand.id}, "config": st.stack, "predicted_gain": cand.expected_gain,
                      "source": "engine_patch", "rationale": cand.hypothesis}, key, agent=AGENT, patch=summary,
            text=text if len(text) <= 512 * 1024 else None)
    gate = "parse"
    try:
        parsed = parse_patch(cand.data)
        gate = "policy"
        try:
            check_policy(parsed, engine.engine_patch_policy())
        except PatchRefusal as r:
            if r.rule != "outside_allowlist":
                raise
            raise PatchRefusal(r.rule, f"{r.why.split(' matches no allowlist')[0]} is not a file of the installed "
                                       "engine package (an upstream PR's tests/, csrc/ or docs/ are not installed); "
                                       "drop those files from the diff") from None
        gate = "critic"
        patch_critic(ctx, cand, parsed, key)
        gate = "isolated copy"
        overlay = engine.engine_patch_overlay(cand.id)
        gate = "stack"
        if knob in st.pinned:
            raise PatchRefusal("pinned_knob", f"{knob} is pinned by the spec to {st.pinned[knob]!r}")
        try:
            config = resolve_config(ctx.knobs, {**st.stack, knob: cand.id}, st.pinned)
        except ConfigError as exc:
            raise PatchRefusal("bad_value", str(exc)) from None
        if config_key(config) in st.measured_config_keys:
            raise PatchRefusal("already_measured", f"{config_key(config)} was measured before")
    except PatchRefusal as r:
        _refuse(ctx, st, summary, r.rule, r.why, gate if r.rule not in _PARSE_RULES else "parse")
        return
    st.extra.refusals_in_a_row = 0
    st.extra.add_proposal({knob: cand.id})
    ctx.progress(f"  gates passed; isolated copy {overlay.get('path')} ({len(overlay.get('files') or {})} patched "
                 f"file(s) over links to the installed package)")
    begin(ctx, st, TRY, key, {"action": "try_config", "changes": {knob: cand.id}, "config": config, "key": key,
                              "predicted_gain": cand.expected_gain, "source": "engine_patch",
                              "rationale": cand.hypothesis, "id": cand.id, "title": cand.title,
                              "sha256": cand.sha256, "overlay": {k: overlay.get(k) for k in ("path", "digest", "package_dir", "base")}})
    _measure(ctx, st, dict(st.pending_action.params) if st.pending_action else {})


def _measure(ctx: SessionContext, st: SessionState, p: Mapping[str, Any]) -> None:
    """The paired end-to-end measurement against the stack, the verdict, and the patch's ``patch`` entry."""
    trial = execute_trial(ctx, st, p, str(p["key"]), agent=AGENT)
    meas = ctx.ledger.find(str(p["key"]) + ":measurement") or {}
    q = meas.get("quality") or {}
    out = {"id": p["id"], "title": p.get("title"), "gate": "measure", "trial": trial.trial, "outcome": trial.verdict,
           "kept": trial.kept, "ratio": trial.ratio, "ci_low": trial.ci_low, "ci_high": trial.ci_high,
           "quality_passed": trial.quality_passed, "quality_rule": q.get("rule"),
           "quality_failed": q.get("failed", []), "measurement_seq": trial.measurement_seq,
           "verdict_seq": trial.verdict_seq, "overlay": p.get("overlay"), "sha256": p.get("sha256"), "engine": True}
    if q.get("rule"):
        out["rule"] = q["rule"]
    ctx.ledger.append(PATCH, out, key=str(p["key"]) + ":outcome")
    ctx.progress(f"  engine patch {p['id']} {'kept' if trial.kept else 'not kept'}: {trial.verdict}")
