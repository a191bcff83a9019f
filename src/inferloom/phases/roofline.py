"""Where a stack sits against the roofline, as the session records it: the
ledger kinds of the profile and roofline entries, the roofline of a measured
objective, and the note a kept trial gets (used by PRELUDE, every trial, the
KERNEL phase and CLOSE)."""

from __future__ import annotations

import statistics
from typing import Any, Mapping

from inferloom.frameworks import framework
from inferloom.measure.costs import DTYPE_BYTES, mean_decode_context, step_costs
from inferloom.measure.diffusion_costs import diffusion_costs, image_roofline
from inferloom.measure.roofline import roofline
from inferloom.models.diffusion_presets import preset_family, uses_cfg_batch
from inferloom.phases.context import SessionContext
from inferloom.session.state import SessionState
from inferloom.session.state_models import Trial, TrialRoofline
from inferloom.workloads.registry import stack_precision

__all__ = ["PROFILE", "ROOFLINE", "roofline_for", "roofline_skip", "kept_roofline"]

PROFILE = "profile"  # ledger kind: one torch.profiler profile
ROOFLINE = "roofline"  # ledger kind: ceilings and where a stack sits under them


def roofline_skip(spec: Any) -> str | None:
    """Why no roofline places this workload's objective (None: it does). The roofline bounds output tok/s of
    ``concurrency`` sequences of ``input_len`` in and ``output_len`` out; a goodput objective (requests/s
    within SLOs) is not in those units, and a trace's requests have their own lengths and arrivals."""
    if spec.diffusion is None and spec.objective != "output_tokens_per_s":
        return (f"the objective is {spec.objective} (requests/s within the SLOs), not output tok/s: "
                "the roofline bounds output tok/s only")
    if getattr(spec.traffic, "trace", None):
        return ("the traffic is a trace (its own arrivals and lengths): the roofline assumes a fixed batch of "
                "input_len/output_len requests")
    return None


def roofline_for(ctx: SessionContext, st: SessionState, tok_per_s: float, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The roofline of ``tok_per_s`` for configuration ``cfg`` (its dtype), or None without ceilings or
    where :func:`roofline_skip` says the objective is not what the roofline bounds."""
    ceil = st.extra.ceilings
    fw = framework(ctx.spec.framework)
    if ceil is None or not fw.runs_operators or roofline_skip(ctx.spec) is not None:
        return None
    t = ctx.spec.traffic
    prec = stack_precision(fw, cfg, ctx.spec.dtype)  # e.g. fp8 weights / KV cache: the stack's own precision
    if prec is not None:
        nbytes, kv_bytes = prec["weight_bytes"], prec["kv_bytes"]
    else:
        dtype = cfg.get("dtype", ctx.spec.dtype)
        nbytes = kv_bytes = DTYPE_BYTES.get(str(dtype), 2)
    d = ctx.spec.diffusion
    if d is not None:  # an image workload: per denoising step, objective in images/s
        cfg_batch = uses_cfg_batch(preset_family(ctx.spec.model), d.guidance_scale)
        costs = diffusion_costs(ctx.spec.model, d.height, d.width, d.batch_size, cfg_batch, nbytes)
        return image_roofline(ceil.model_dump(), costs, d.steps, tok_per_s)
    costs = step_costs(ctx.spec.model, t.concurrency, mean_decode_context(t.input_len, t.output_len), nbytes,
                       input_len=t.input_len, kv_dtype_bytes=kv_bytes)
    out = roofline(ceil.model_dump(), costs, tok_per_s, t.concurrency, t.output_len, t.input_len)
    if prec is not None:
        out["precision"] = prec
    return out


def kept_roofline(ctx: SessionContext, st: SessionState, res: Mapping[str, Any], key: str, trial: Trial) -> None:
    """Where a kept stack (``trial``'s config) sits against the roofline: its
    median in the measurement that kept it; recorded once, also across a
    resume. Nothing without ceilings (a warm replay keeps before PRELUDE has
    measured them: PRELUDE calls this again once it has)."""
    vals = [p["value_b"] for p in (res.get("protocol") or {}).get("pairs", []) if p.get("value_b") is not None]
    roof = roofline_for(ctx, st, statistics.median(vals), dict(trial.config)) if vals else None
    if roof is None:
        return
    found = ctx.ledger.find(key + ":roofline")
    seq = found["seq"] if found is not None else ctx.ledger.append(
        ROOFLINE, {"kept": {"trial": trial.trial, "cycle": st.cycle, "changes": trial.changes, "roofline": roof}},
        key=key + ":roofline")
    trial.roofline = TrialRoofline(fraction=roof.get("fraction"), headroom=roof.get("headroom"),
                                   suspect=roof.get("suspect"), ledger_seq=seq)
    ctx.progress(f"  roofline: the stack is now at {roof['fraction'] * 100:.1f}% of the ceiling "
                 f"(headroom x{roof['headroom']:.2f})" + ("; SUSPECT: above the roofline" if roof.get("suspect") else ""))
