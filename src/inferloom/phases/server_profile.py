"""A server session's own profile, for the KERNEL phase's targets: whether to take one, and taking it.

A server runs out of process, so its profile costs a server start of its own and the trace's flush
(``Framework.server_profile``; vLLM: ``workloads/vllm_profile.py``, its ``/start_profile`` ..
``/stop_profile``). Only the KERNEL phase uses it (its targets and the Amdahl bound of each candidate), so
:func:`decide` takes one only when that phase will run the engine's own backend (``kernels.backend:
plugin``) or when FRAMEWORK has engine patches a profile could order (``serving.engine_patches`` whose
files run in at least two different sets of categories: ``vllm_engine_patches.profile_orders``), and
``kernels.server_profile`` says how: ``auto`` when its estimated cost (the session's
slowest server start so far, or :data:`DEFAULT_START_S`, plus the trace's flush,
``measure.server_profile.TRACE_FLUSH_S``) is at most half the KERNEL phase's share of the budget
(``kernels.budget_share`` of the session's minutes), ``always`` then, ``never`` not at all. Without one the
phase falls back to the backend's fixed order, claiming no share; the ledger says which and why.

:func:`take` profiles a configuration once per ledger key (resumable: a profile in the ledger is reused);
the session's idle servers are stopped first (the profile's server needs their memory); the trace stays
under the session directory (``server_profiles/``); a failed profile is an entry with its error, not the
session's end.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from inferloom.frameworks import framework
from inferloom.measure.server_profile import TRACE_FLUSH_S
from inferloom.phases.common import jsonable
from inferloom.phases.context import SessionContext
from inferloom.phases.roofline import PROFILE
from inferloom.session import ledger as L
from inferloom.session.state import SessionState
from inferloom.workloads import registry as _engines
from inferloom.workloads.vllm_engine_patches import profile_orders

__all__ = ["decide", "estimate_s", "take", "PROFILES_DIR", "DEFAULT_START_S"]

PROFILES_DIR = "server_profiles"
DEFAULT_START_S = 120.0  # a server start's estimate before the session has timed one


def estimate_s(ctx: SessionContext, st: SessionState) -> float:
    """The profile's estimated cost: the slowest server start of the session so far, plus the trace's flush."""
    starts = [float(e["server_startup_s"]) for e in ctx.ledger.entries(L.SERVER_START)
              if isinstance(e.get("server_startup_s"), (int, float))]
    return (max(starts) if starts else DEFAULT_START_S) + TRACE_FLUSH_S.get(str(st.device), TRACE_FLUSH_S["cpu"])


def decide(ctx: SessionContext, st: SessionState, backend: Any, backend_why: str) -> tuple[bool, str]:
    """``(take, why)``: whether this session takes a server profile (see the module docstring); ``backend``,
    ``backend_why``: the KERNEL phase's backend and why (``phases.backend_choice.kernel_backend``)."""
    fw = framework(ctx.spec.framework)
    skip = fw.profile_skip or "no server profile"
    if not fw.server_profile:
        return False, skip
    mode = ctx.spec.kernels.server_profile
    if mode == "never":
        return False, f"{skip} (kernels.server_profile: never)"
    own = _engines.kernel_backend(fw)
    kernel = backend is not None and own is not None and backend.name == own.name
    patches = profile_orders(getattr(ctx.spec.serving, "engine_patches", None))
    if not kernel and not patches:
        return False, f"{skip}; neither the KERNEL phase ({backend_why}) nor an engine patch order will use one"
    users = " and ".join(u for u, on in (("the KERNEL phase runs the engine's own backend", kernel),
                                         (f"{patches} engine patches touching different categories are ranked by it", patches >= 2)) if on)
    if mode == "always":
        return True, f"{users} (kernels.server_profile: always)"
    cost, allowed = estimate_s(ctx, st), 0.5 * float(ctx.spec.kernels.budget_share) * st.budget.minutes * 60
    if cost > allowed:
        return False, (f"{skip}; a server profile would cost ~{cost:.0f} s (a server start and the trace's flush), "
                       f"over half the KERNEL phase's share of the budget ({allowed:.0f} s): kernels.server_profile: "
                       "always takes it anyway")
    return True, f"{users}; ~{cost:.0f} s estimated, within half the KERNEL phase's share of the budget ({allowed:.0f} s)"


def take(ctx: SessionContext, st: SessionState, config: Mapping[str, Any], key: str, what: str,
         why: str, **record: Any) -> dict[str, Any]:
    """The ledger's ``profile`` entry for ``config`` under ``key``, taken now if it isn't there yet."""
    found = ctx.ledger.find(key)
    if found is not None:
        return found
    fw = framework(ctx.spec.framework)
    stop_idle = getattr(ctx.adapter, "stop_idle", None)
    stopped = list(stop_idle()) if callable(stop_idle) else []
    ctx.progress(f"profiling one run of {what} through the server's own profiler (a server start and its trace"
                 + (f"; {len(stopped)} idle server(s) stopped first" if stopped else "") + ")")
    trace_dir = ctx.dir / PROFILES_DIR / re.sub(r"[^0-9A-Za-z_.-]", "_", key)
    log_dir = ctx.adapter.log_dir() if callable(getattr(ctx.adapter, "log_dir", None)) else None
    try:
        prof = _engines.server_profile(fw, ctx.spec, dict(config), trace_dir, log_dir, ctx.progress)
        prof["trace"] = str(prof.get("trace", "")).removeprefix(str(ctx.dir) + "/")
    except Exception as exc:  # noqa: BLE001 - no profile is the fixed order's reason, not the session's end
        prof = {"error": f"{type(exc).__name__}: {exc}"}
    seq = ctx.ledger.append(PROFILE, {"profile": jsonable(prof), "server": True, "stack": dict(config),
                                      "why": why, **record}, key=key)
    return {"profile": prof, "seq": seq}
