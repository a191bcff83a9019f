"""ENABLEMENT: entered only when the stock baseline fails. Classify the
failure, then climb the ladder from least to most invasive; each rung and its
result goes into the ledger (what was tried, the start's classified outcome,
the duration, the quality probe, the stack it ran on). Rung 1: read-only
diagnosis; rung 2: a flag or environment change; rungs 3-5 (an adapter with
:class:`~inferloom.workloads.base.SourceRungs`, a server engine's
``engine_ladder``): an in-tree engine patch, an alternate environment from a
wheelhouse, an upstream diff, each started and probed; the first whose server
starts, runs and passes :func:`rung_probe` is the new stock (its knobs, and so
its overlay or python, carry into every later server). Rung 6 (rebuilding
compiled components) is written down, never run (docs/enablement.md).
Recovered: back to PRELUDE to measure the new stock; not recovered: CLOSE."""

from __future__ import annotations

import time
from typing import Any

from inferloom.measure.quality import capture_reference, quality_prompt_sets, self_consistency
from inferloom.phases.common import step_key as _key
from inferloom.phases.context import SessionContext
from inferloom.session import ledger as L
from inferloom.session.state import Phase, SessionState
from inferloom.workloads.base import (AdapterError, ConfigError, RecoveryOptions, ServerReuse, SourceRungs,
                                      resolve_config)

__all__ = ["RUNGS", "FAILURE_KINDS", "NEXT_RUNG", "REBUILD_ON_PAPER", "enablement_step", "climb", "recovery_options",
           "rung_probe"]

RUNGS = ("read-only diagnosis", "flag or environment change", "in-tree patch", "alternate environment",
         "upstream diff", "rebuild")
#: rung 6, written down and never run (docs/enablement.md, "Rung 6")
REBUILD_ON_PAPER = ("written down, not run: rebuild the engine's compiled components (vLLM: its _C / _moe_C custom-op "
                    "extensions, from its csrc/ for the device's architecture: TORCH_CUDA_ARCH_LIST=9.0 for an H200) "
                    "with the toolchain its torch was built with, in a fresh virtualenv, then rung 4 with the wheel it "
                    "gives: docs/enablement.md")

# What a failed stock launch or run is classified as (server adapters classify
# from the launch log: inferloom.workloads.server_process.classify_failure), and
# the rung above 2 that each would need when no flag or environment change helps.
FAILURE_KINDS = ("oom", "unsupported_flag", "missing_kernel", "model_config", "startup_timeout", "crash",
                 "compile", "unsupported", "error")
NEXT_RUNG = {"oom": 4, "unsupported_flag": 4, "missing_kernel": 4, "model_config": 3, "startup_timeout": 3,
             "crash": 3, "compile": 3, "unsupported": 4, "error": 3}


def recovery_options(kind: str, stock: dict[str, Any], knobs: list[Any]) -> list[dict[str, Any]]:
    """Least invasive configuration changes for a failure kind (generic rules;
    an adapter may offer its own: :class:`~inferloom.workloads.base.RecoveryOptions`)."""
    names = {k.name for k in knobs}
    opts: list[dict[str, Any]] = []
    if kind == "oom" and "micro_batch" in names:
        mb = int(stock["micro_batch"])
        while mb > 1:
            mb //= 2
            opts.append({"micro_batch": mb})
    if kind in ("compile", "error") and "compile_mode" in names and stock.get("compile_mode") != "off":
        opts.append({"compile_mode": "off"})
    if kind in ("error", "unsupported") and "attn_implementation" in names and stock.get("attn_implementation") != "eager":
        opts.append({"attn_implementation": "eager"})
    return opts


def enablement_step(ctx: SessionContext, st: SessionState) -> None:
    """Climb the ladder once: a working stock goes back to PRELUDE, none closes the session."""
    outcome = climb(ctx, st)
    if outcome is None:
        st.stop_reason = st.stop_reason or "enablement: stock could not be made to run"
        ctx.enter_phase(st, Phase.CLOSE, st.stop_reason)
    else:
        st.stock_config = outcome
        st.stack = dict(outcome)
        st.extra.stock_objective = None  # PRELUDE measures the new stock
        st.extra.enablement_round = (st.extra.enablement_round or 0) + 1
        ctx.enter_phase(st, Phase.PRELUDE, "enablement recovered stock; re-measuring the baseline")


def climb(ctx: SessionContext, st: SessionState) -> dict[str, Any] | None:
    """Returns a working stock configuration, or None (the session closes)."""

    fail = st.extra.stock_failure
    kind = fail.kind if fail is not None else "error"
    error = fail.error if fail is not None else None
    ctx.ledger.append(L.ENABLEMENT_RUNG, {"rung": 1, "name": RUNGS[0], "failure_kind": kind, "error": error,
                                        "outcome": f"classified as '{kind}'"}, key=_key("rung1", st.session_id))
    options = (ctx.adapter.recovery_options(kind, dict(st.stock_config)) if isinstance(ctx.adapter, RecoveryOptions)
               else recovery_options(kind, st.stock_config, ctx.knobs))
    # servers of a pair: the failed stock's first server still holds its share (on the H200 an OLMoE stock's
    # second server ran out of memory beside it, then so did every rung-2 start); for an out-of-memory stock
    # each rung-2 smoke starts two servers of its configuration side by side, as the A/A and every trial do
    servers = isinstance(ctx.adapter, ServerReuse)
    if servers:
        ctx.adapter.stop_idle()
        ctx.record_server_starts()
    for i, change in enumerate(options):
        if any(k in st.pinned for k in change):
            ctx.ledger.append(L.ENABLEMENT_RUNG, {"rung": 2, "name": RUNGS[1], "change": change,
                                                "outcome": "skipped: touches a pinned knob"},
                            key=_key("rung2", st.session_id, i))
            continue
        try:
            cfg = resolve_config(ctx.knobs, {**st.stock_config, **change}, st.pinned)
        except ConfigError as exc:
            ctx.ledger.append(L.ENABLEMENT_RUNG, {"rung": 2, "name": RUNGS[1], "change": change, "outcome": f"invalid: {exc}"},
                            key=_key("rung2", st.session_id, i))
            continue
        pair = servers and kind == "oom"
        ok, err, _start, _ = _smoke(ctx, cfg, pair=pair)
        if servers and not ok:
            ctx.adapter.stop_idle()  # a rung's server that did start holds memory the next rung needs
        ctx.record_server_starts()
        ctx.ledger.append(L.ENABLEMENT_RUNG, {"rung": 2, "name": RUNGS[1], "change": change,
                                            "outcome": "runs" if ok else f"still fails: {err}",
                                            **({"pair": True} if pair else {})},
                        key=_key("rung2", st.session_id, i))
        ctx.progress(f"ENABLEMENT rung 2 {change}: {'runs' if ok else 'still fails'}")
        if ok:
            st.extra.enablement_changes = {k: cfg[k] for k in cfg if cfg[k] != st.stock_config.get(k)}
            return cfg
    if not options:
        ctx.ledger.append(L.ENABLEMENT_RUNG, {"rung": 2, "name": RUNGS[1], "failure_kind": kind,
                                            "outcome": f"no flag or environment change is known for '{kind}'"},
                        key=_key("rung2-none", st.session_id))
    need = NEXT_RUNG.get(kind, 3)
    if isinstance(ctx.adapter, SourceRungs):
        for rung in (3, 4, 5):
            found = _source_rung(ctx, st, rung, kind, pair=servers and kind == "oom")
            if found is not None:
                return found
    else:
        for r in (3, 4, 5):
            _record(ctx, st, r, "none", {"failure_kind": kind, "outcome": "nothing to try: the engine has no source "
                                         "rungs (SourceRungs)"})
    _record(ctx, st, 6, "paper", {"failure_kind": kind, "outcome": REBUILD_ON_PAPER})
    st.stop_reason = (f"enablement: stock fails ({kind}: {str(error)[:300]}); rungs 1-5 did not recover it (its "
                      f"classification points at rung {need} ({RUNGS[need - 1]})); rung 6 ({RUNGS[5]}) is written down, "
                      "not run: docs/enablement.md")
    return None


def _record(ctx: SessionContext, st: SessionState, rung: int, tag: Any, body: dict[str, Any]) -> None:
    ctx.ledger.append(L.ENABLEMENT_RUNG, {"rung": rung, "name": RUNGS[rung - 1], **body},
                      key=_key(f"rung{rung}", st.session_id, tag))


def _source_rung(ctx: SessionContext, st: SessionState, rung: int, kind: str, pair: bool = False
                 ) -> dict[str, Any] | None:
    """Rung 3, 4 or 5: each candidate started on stock's configuration; the first whose server starts, runs and
    passes the rung's quality probe is the new stock (recorded with its stack), else None. ``pair`` (an
    out-of-memory stock on a server engine): each candidate starts two servers side by side, as rung 2's do,
    and a server left from a failed candidate is stopped before the next."""
    cands, why = ctx.adapter.source_rungs(rung)
    if not cands:
        _record(ctx, st, rung, "none", {"failure_kind": kind, "outcome": f"nothing to try: {why}"})
        ctx.progress(f"ENABLEMENT rung {rung} ({RUNGS[rung - 1]}): nothing to try: {why}")
        return None
    for c in cands:
        ctx.progress(f"ENABLEMENT rung {rung} ({RUNGS[rung - 1]}): trying {c['what']}")
        t0 = time.perf_counter()
        body: dict[str, Any] = {"tried": c["what"], "candidate": c["name"], "change": c["change"]}
        try:
            cfg = resolve_config(ctx.knobs, {**st.stock_config, **c["change"]}, st.pinned)
        except ConfigError as exc:
            cfg, ok, err, start = None, False, f"invalid: {exc}", "invalid"
        else:
            ok, err, start, probe = _smoke(ctx, cfg, probe=True, pair=pair)
            body["quality_probe"] = probe
            if pair:
                body["pair"] = True  # its smoke starts two servers of it side by side
        body.update({"start": start, "duration_s": round(time.perf_counter() - t0, 3)})
        passed = ok and bool((body.get("quality_probe") or {}).get("passed"))
        if pair and not passed:
            ctx.adapter.stop_idle()  # a server of it that did start holds memory the next candidate needs
        body["outcome"] = ("runs; quality probe passed" if passed else f"still fails: {err}" if not ok
                           else f"runs, but the quality probe failed: {body['quality_probe'].get('why')}")
        if ok and cfg is not None:
            try:
                body["stack"] = ctx.adapter.rung_stack(cfg)
            except AdapterError as exc:
                body["stack"] = {"error": str(exc)}
        ctx.record_server_starts()
        _record(ctx, st, rung, c["name"], {"failure_kind": kind, **body})
        ctx.progress(f"ENABLEMENT rung {rung} {c['name']}: {body['outcome'][:300]} ({body['duration_s']:.1f} s)")
        if passed and cfg is not None:
            st.extra.enablement_changes = {k: cfg[k] for k in cfg if cfg[k] != st.stock_config.get(k)}
            return cfg
    return None


def _smoke(ctx: SessionContext, cfg: dict[str, Any], probe: bool = False, pair: bool = False
           ) -> tuple[bool, str | None, str, dict[str, Any] | None]:
    """Start ``cfg`` and run it once: ``(runs, error, the start's classified outcome, the quality probe's
    verdict when ``probe``)``. The start's outcome: ``healthy``, or the kind its failure was classified as
    (a server's: ``server_process.classify_failure`` over its log; ``patch_refused``, ``engine_env``).
    ``pair``: a second instance of ``cfg`` is started beside the first (both must start)."""
    handles = []
    try:
        for _ in range(2 if pair else 1):
            try:
                handles.append(ctx.adapter.prepare(cfg))
            except AdapterError as exc:
                return False, str(exc), exc.kind, None
        h = handles[0]
        rec = ctx.adapter.run(h, 1)
        if not rec.success:
            return False, rec.error, "healthy", None
        return True, None, "healthy", (rung_probe(ctx, h) if probe else None)
    finally:
        for h in handles:
            ctx.adapter.release(h)


def rung_probe(ctx: SessionContext, handle: Any) -> dict[str, Any]:
    """The quality probe of a rung's server (stock never ran, so there is no stock output to compare with):
    on the eval prompts, its greedy continuations and its teacher-forced log-probs of them must be well formed
    (every prompt answered at full length, finite log-probs), agree with each other (the greedy token is the
    argmax of its own forward pass at least ``quality.min_greedy_agreement`` of the time: a patch that breaks
    decode against prefill fails), and not be one token repeated everywhere (a server that computes nothing)."""
    q = ctx.spec.quality
    try:
        prompts = quality_prompt_sets(ctx.spec, ctx.adapter)["eval"]
        ref = capture_reference(ctx.adapter, handle, "eval", prompts, q.continuation_len)
        lp = ref.logprobs
        checks = {
            "answered": len(ref.continuations) == len(prompts) and all(len(c) == q.continuation_len
                                                                       for c in ref.continuations),
            "finite": bool(lp.max(-1).values.isfinite().all()),
        }
        agree = 1.0 - self_consistency(ref)["stock_path_flip_rate"]
        checks["self_consistent"] = agree >= q.min_greedy_agreement
        checks["not_constant"] = len({t for c in ref.continuations for t in c}) > 1
    except Exception as exc:  # noqa: BLE001 - a probe that raises is a failed probe (recorded), not a crash
        return {"passed": False, "why": f"the probe raised {type(exc).__name__}: {str(exc)[:300]}"}
    failed = [k for k, v in checks.items() if not v]
    return {"passed": not failed, "checks": checks, "greedy_self_agreement": agree, "prompts": len(prompts),
            "why": ("failed: " + ", ".join(failed)) if failed else "all checks passed"}
