"""One timed run of a server framework's server (``ServerAdapter.run``): untimed warm-up requests, a wait until the other
live servers are quiet, the streaming load generator (``inferloom.loadgen``) on the run's fresh prompts, and
the RunRecord: ``extra['serving']`` (vLLM bench field names), ``extra['idle_servers_cpu_s']`` (the CPU seconds
the other live servers burnt meanwhile), ``extra['server_jit']`` (the kernels the server's log says it
JIT-compiled during the timed requests, ``server_jit``), a failure as data with its kind. A trace run (``trace_plan``) sends
its window's prompts at their arrival offsets with their own output lengths (``extra['serving']['trace']``
records the file, its sha256, the window, the time scale and how late requests were sent)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from inferloom.loadgen.client import run_load
from inferloom.loadgen.metrics import SLO, summarize
from inferloom.workloads.base import RunRecord
from inferloom.workloads.server_process import ServerProcess, servers_cpu_seconds, wait_quiet
from inferloom.workloads.server_jit import jit_events, log_offset
from inferloom.workloads.server_launch import SERVED_NAME
from inferloom.workloads.server_start import ServerHandle

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec
    from inferloom.workloads.vllm_trace import TracePlan

__all__ = ["serving_run"]


def serving_run(spec: WorkloadSpec, handle: ServerHandle, seed: int, *, draw_prompts: Callable[..., list[list[int]]],
                run_prompts: Callable[[int], tuple[list[list[int]], dict[str, Any]]],
                others: Callable[[], list[ServerProcess]], model_id: Callable[[], str],
                trace_plan: Callable[[int], TracePlan] | None = None) -> RunRecord:
    """The run of ``handle``'s server for ``seed``: ``draw_prompts(seed, n)`` draws the warm-up prompts,
    ``run_prompts(seed)`` the timed ones and their cache state (``trace_plan(seed)``, when given, the
    trace window's instead), ``others()`` the other live servers, ``model_id()`` the model directory the
    server loads."""
    s, t = spec.serving, spec.traffic
    plan = trace_plan(seed) if trace_plan is not None else None
    n = len(plan.prompts) if plan is not None else spec.requests_per_run
    out_lens: int | list[int] = plan.output_lens if plan is not None else t.output_len
    expected = sum(plan.output_lens) if plan is not None else n * t.output_len
    rec = RunRecord(config_id=handle.config_id, seed=seed, success=False, started_at=time.time(),
                    num_requests=n, expected_output_tokens=expected,
                    extra={"handle_id": handle.id, "concurrency": t.concurrency})
    if handle.released or not handle.server.alive():
        rec.error = f"crash: server {handle.id} is not running (log {handle.server.log_path})"
        rec.extra["kind"] = "crash"
        return rec
    if plan is not None:
        prompts, cache = plan.prompts, {"prompt_mode": "trace", "shared_prefix_len": 0,
                                        "fresh_prompts_per_run": True, "seed": seed, "prompts": "random"}
    else:
        prompts, cache = run_prompts(seed)
    warm_n = s.warmup_requests if s.warmup_requests is not None else t.concurrency
    warm = draw_prompts(seed + 500_000_003, warm_n) if warm_n else []
    try:
        if warm:  # untimed, excluded from every number
            run_load(handle.server.base_url, SERVED_NAME, warm, t.output_len, concurrency=t.concurrency,
                     seed=seed, timeout_s=s.request_timeout_s)
        rec.extra["quiet_wait"] = wait_quiet(others())
        cpu0 = servers_cpu_seconds(others())
        log0 = log_offset(handle.server.log_path)
        records, duration = run_load(handle.server.base_url, SERVED_NAME, prompts, out_lens,
                                     concurrency=t.trace_max_in_flight if plan is not None else t.concurrency,
                                     request_rate=s.request_rate if s.arrival == "poisson" else None,
                                     seed=seed, timeout_s=s.request_timeout_s,
                                     arrivals=plan.arrivals if plan is not None else None)
    except Exception as exc:  # noqa: BLE001 - failures are data
        rec.error = f"error: load generator: {type(exc).__name__}: {exc}"[:1000]
        rec.extra["kind"] = "error"
        return rec
    idle_cpu = servers_cpu_seconds(others()) - cpu0
    jit = jit_events(handle.server.log_path, log0)
    if jit:  # the server compiled during the timed requests (server_jit's docstring); only then: older records keep their keys
        rec.extra["server_jit"] = jit
    slo = SLO(s.slo_ttft_ms, s.slo_tpot_ms, s.slo_e2el_ms)
    cache["prefix_caching"] = handle.config.get("prefix_caching")
    extra: dict[str, Any] = {
        "cache_state": cache, "arrival": s.arrival, "request_rate": s.request_rate if s.arrival == "poisson" else None,
        "max_concurrency": t.concurrency, "warmup_requests": len(warm), "model_id": model_id(),
        "backend": "openai", "endpoint": "/v1/completions"}
    if plan is not None:
        lags = [r.send_lag for r in records if r.send_lag is not None]
        extra.update(arrival="trace", max_concurrency=t.trace_max_in_flight, trace={
            **plan.state, "requested_output_lens": plan.output_lens,
            "max_send_lag_ms": max(lags) * 1000.0 if lags else None})
    summary = summarize(records, duration, slo, extra=extra)
    # per-token gaps are summarized above (mean/median/std/p50/p90/p99 itl), not kept per run: at c64 x 128
    # tokens they were 540 KB of each run's ledger record; errors are kept only where a request failed
    summary.pop("itls", None)
    summary["errors"] = {str(i): e for i, e in enumerate(summary.get("errors") or []) if e}
    rec.extra["serving"] = summary
    rec.extra["idle_servers_cpu_s"] = idle_cpu
    rec.wall_s = duration
    rec.input_tokens = summary["total_input_tokens"]
    rec.output_tokens = summary["total_output_tokens"]
    if summary["failed"]:
        alive = handle.server.alive()
        first = next(r.error for r in records if not r.success)
        kind = "error" if alive else "crash"
        rec.error = (f"{kind}: {summary['failed']} of {n} requests failed (first: {first})"
                     + ("" if alive else f"; the server died (log {handle.server.log_path})"))[:2000]
        rec.extra["kind"] = kind
        return rec
    rec.success = rec.output_tokens == rec.expected_output_tokens and duration > 0
    if not rec.success:
        rec.error = f"token_count: {rec.output_tokens} output tokens, expected {rec.expected_output_tokens}"
        rec.extra["kind"] = "token_count"
    return rec
