"""One timed run of a vLLM server (``VLLMAdapter.run``): untimed warm-up requests, a wait until the other
live servers are quiet, the streaming load generator (``inferloom.loadgen``) on the run's fresh prompts, and
the RunRecord: ``extra['serving']`` (vLLM bench field names), ``extra['idle_servers_cpu_s']`` (the CPU seconds
the other live servers burnt meanwhile), a failure as data with its kind."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from inferloom.loadgen.client import run_load
from inferloom.loadgen.metrics import SLO, summarize
from inferloom.workloads.base import RunRecord
from inferloom.workloads.server_process import ServerProcess, servers_cpu_seconds, wait_quiet
from inferloom.workloads.vllm_launch import SERVED_NAME
from inferloom.workloads.vllm_servers import VLLMHandle

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["serving_run"]


def serving_run(spec: WorkloadSpec, handle: VLLMHandle, seed: int, *, draw_prompts: Callable[..., list[list[int]]],
                run_prompts: Callable[[int], tuple[list[list[int]], dict[str, Any]]],
                others: Callable[[], list[ServerProcess]], model_id: Callable[[], str]) -> RunRecord:
    """The run of ``handle``'s server for ``seed``: ``draw_prompts(seed, n)`` draws the warm-up prompts,
    ``run_prompts(seed)`` the timed ones and their cache state, ``others()`` the other live servers,
    ``model_id()`` the model directory the server loads."""
    s, t = spec.serving, spec.traffic
    n = spec.requests_per_run
    rec = RunRecord(config_id=handle.config_id, seed=seed, success=False, started_at=time.time(),
                    num_requests=n, expected_output_tokens=n * t.output_len,
                    extra={"handle_id": handle.id, "concurrency": t.concurrency})
    if handle.released or not handle.server.alive():
        rec.error = f"crash: server {handle.id} is not running (log {handle.server.log_path})"
        rec.extra["kind"] = "crash"
        return rec
    prompts, cache = run_prompts(seed)
    warm_n = s.warmup_requests if s.warmup_requests is not None else t.concurrency
    warm = draw_prompts(seed + 500_000_003, warm_n) if warm_n else []
    try:
        if warm:  # untimed, excluded from every number
            run_load(handle.server.base_url, SERVED_NAME, warm, t.output_len, concurrency=t.concurrency,
                     seed=seed, timeout_s=s.request_timeout_s)
        rec.extra["quiet_wait"] = wait_quiet(others())
        cpu0 = servers_cpu_seconds(others())
        records, duration = run_load(handle.server.base_url, SERVED_NAME, prompts, t.output_len,
                                     concurrency=t.concurrency,
                                     request_rate=s.request_rate if s.arrival == "poisson" else None,
                                     seed=seed, timeout_s=s.request_timeout_s)
    except Exception as exc:  # noqa: BLE001 - failures are data
        rec.error = f"error: load generator: {type(exc).__name__}: {exc}"[:1000]
        rec.extra["kind"] = "error"
        return rec
    idle_cpu = servers_cpu_seconds(others()) - cpu0
    slo = SLO(s.slo_ttft_ms, s.slo_tpot_ms, s.slo_e2el_ms)
    cache["prefix_caching"] = handle.config.get("prefix_caching")
    summary = summarize(records, duration, slo, extra={
        "cache_state": cache, "arrival": s.arrival, "request_rate": s.request_rate if s.arrival == "poisson" else None,
        "max_concurrency": t.concurrency, "warmup_requests": len(warm), "model_id": model_id(),
        "backend": "openai", "endpoint": "/v1/completions"})
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
