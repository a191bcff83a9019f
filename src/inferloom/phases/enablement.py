"""ENABLEMENT: entered only when the stock baseline fails. Classify the
failure, then climb the ladder from least to most invasive; each rung and its
result goes into the ledger. Rungs 1 (read-only diagnosis) and 2 (flag or
environment change) work now; rungs 3-6 are declared, and a session that
would need them stops with that stated as its reason. Recovered: back to
PRELUDE to measure the new stock; not recovered: CLOSE."""

from __future__ import annotations

from typing import Any

from inferloom.phases.common import step_key as _key
from inferloom.phases.context import SessionContext
from inferloom.session import ledger as L
from inferloom.session.state import Phase, SessionState
from inferloom.workloads.base import AdapterError, ConfigError, RecoveryOptions, resolve_config

__all__ = ["RUNGS", "FAILURE_KINDS", "NEXT_RUNG", "enablement_step", "climb", "recovery_options"]

RUNGS = ("read-only diagnosis", "flag or environment change", "source patch", "alternate environment",
         "upstream diff", "rebuild")

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
        ok, err = _smoke(ctx, cfg)
        ctx.ledger.append(L.ENABLEMENT_RUNG, {"rung": 2, "name": RUNGS[1], "change": change,
                                            "outcome": "runs" if ok else f"still fails: {err}"},
                        key=_key("rung2", st.session_id, i))
        ctx.progress(f"ENABLEMENT rung 2 {change}: {'runs' if ok else 'still fails'}")
        if ok:
            return cfg
    if not options:
        ctx.ledger.append(L.ENABLEMENT_RUNG, {"rung": 2, "name": RUNGS[1], "failure_kind": kind,
                                            "outcome": f"no flag or environment change is known for '{kind}'"},
                        key=_key("rung2-none", st.session_id))
    need = NEXT_RUNG.get(kind, 3)
    for r in range(3, 7):  # declared, not implemented: recorded so the ledger shows the whole ladder
        ctx.ledger.append(L.ENABLEMENT_RUNG, {"rung": r, "name": RUNGS[r - 1], "failure_kind": kind,
                                            "outcome": "declared, not available in this version"
                                            + (": this failure needs it; stopping" if r == need else "")},
                        key=_key(f"rung{r}", st.session_id))
    st.stop_reason = (f"enablement: stock fails ({kind}: {str(error)[:300]}); rungs 1-2 did not recover "
                      f"it and it needs rung {need} ({RUNGS[need - 1]}), which is not available yet")
    return None


def _smoke(ctx: SessionContext, cfg: dict[str, Any]) -> tuple[bool, str | None]:
    try:
        h = ctx.adapter.prepare(cfg)
    except AdapterError as exc:
        return False, str(exc)
    try:
        rec = ctx.adapter.run(h, 1)
        return rec.success, rec.error
    finally:
        ctx.adapter.release(h)
