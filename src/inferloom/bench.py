"""`inferloom bench`: stock vs one candidate (or stock vs stock, A/A) through the
measurement protocol and the quality contract, with a JSON result.

Order of work: prepare both configurations -> warm up each (compilation and
warm-up time recorded, never inside a timed run) -> interleaved timed pairs
(``measure.protocol``) -> quality probes (after timing, so they never disturb
it) -> result. The only keep / revert decision comes from the protocol; the
quality contract can veto it.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from inferloom.measure import protocol as proto
from inferloom.measure.slo_bound import slo_binding
from inferloom.provenance import environment
from inferloom.session.atomic import write_json_atomic
from inferloom.measure.compare import References, compare
from inferloom.spec import WorkloadSpec, spec_hash
from inferloom.workloads.base import ConfigError, resolve_config
from inferloom.workloads.registry import make_adapter

__all__ = ["SCHEMA_VERSION", "run_bench", "run_seed_base", "write_json_atomic", "overall_verdict"]

SCHEMA_VERSION = 1
Progress = Callable[[str], None]


def run_seed_base(spec: WorkloadSpec) -> int:
    """Timed runs draw prompts from seed_base + pair index; warm-ups below it."""
    return spec.seed * 1_000_003 + 1_000


def overall_verdict(protocol_verdict: str, quality_passed: bool | None, aa: bool) -> str:
    """The one-word outcome. A speed keep with a failed quality contract is rejected."""
    if aa:
        return "noise-measured" if protocol_verdict != "failed" else "failed"
    if protocol_verdict == "failed":
        return "failed"
    if quality_passed is False:
        return "reject-quality"
    if quality_passed is None and protocol_verdict == "keep":
        return "keep-unscored"
    return protocol_verdict


def run_bench(
    spec: WorkloadSpec,
    candidate: Mapping[str, Any] | None,
    *,
    aa: bool = False,
    adapter: Any = None,
    progress: Progress = lambda _m: None,
    quality: bool = True,
    on_pair: Callable[[Any, Any], None] | None = None,
    out_hint: str | None = None,
) -> dict[str, Any]:
    """Measure stock vs candidate (or A/A). Returns the JSON-able result dict."""
    t_start = time.time()
    candidate = dict(candidate or {})
    if aa and candidate:
        raise ConfigError("--aa measures stock against itself; it takes no --candidate")
    own_adapter = adapter is None
    adapter = adapter if adapter is not None else make_adapter(spec)
    try:
        settings = proto.ProtocolSettings.from_spec(spec.protocol)
        knobs = adapter.knob_space()
        stock_cfg = resolve_config(knobs, {}, spec.pinned)
        cand_cfg = resolve_config(knobs, candidate, spec.pinned)
        if not aa and cand_cfg == stock_cfg:
            raise ConfigError("the candidate equals the stock configuration; give at least one --candidate key=value that differs")
        d = spec.diffusion
        shape = (f"{d.width}x{d.height}, {d.steps} steps, batch {d.batch_size}, {d.images_per_run} images per run"
                 if d is not None else f"trace {spec.traffic.trace} at x{spec.traffic.trace_speed:g}"
                 if spec.traffic.trace else f"concurrency {spec.traffic.concurrency}, {spec.traffic.input_len} in / "
                 f"{spec.traffic.output_len} out")
        progress(f"workload: {spec.model}, device {spec.resolved_device()}, dtype {spec.dtype}, {shape}"
                 + (f"; result -> {out_hint}" if out_hint else ""))
        b_label = "stock-2" if aa else "candidate"
        result: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "kind": "aa" if aa else "bench",
            "started_at": t_start,
            "spec": spec.to_dict(),
            "spec_hash": spec_hash(spec),
            "adapter": adapter.describe(),
            "candidate_overrides": candidate,
            "stock_config": stock_cfg,
            "candidate_config": cand_cfg,
            "numerics_changing_knobs": sorted(k.name for k in knobs if k.changes_numerics and cand_cfg[k.name] != stock_cfg[k.name]),
            "environment": environment(),
        }
        cmp = compare(adapter, spec, stock_cfg, cand_cfg, settings=settings, seed_base=run_seed_base(spec),
                      refs=References() if quality else None, quality_sets=("eval", "heldout") if quality else (),
                      progress=progress, stop_early=not aa, labels=("stock", b_label), on_pair=on_pair,
                      stock_is_base=True)
        t, res = cmp.timings, cmp.as_dict()  # res: the comparison's JSON form, copied into the result
        result["timings"] = {
            "prepare_stock_s": t.get("prepare_stock_s"), f"prepare_{b_label}_s": t.get(f"prepare_{b_label}_s"),
            "warmup_stock": t.get("warmup_base"), "warmup_candidate": t.get("warmup_candidate"),
            "compile_overhead_stock_s": t.get("compile_overhead_base_s"),
            "compile_overhead_candidate_s": t.get("compile_overhead_candidate_s"),
            "timed_runs_s": t.get("timed_runs_s"),
        }
        for k in ("protocol", "noise", "error", "error_kind"):
            if k in res:
                result[k] = res[k]
        bound = slo_binding(cmp.pairs)
        if bound is not None:  # goodput: did the SLOs decide anything?
            result["slo_binding"] = bound
        result["quality"] = cmp.quality
        result["verdict"] = overall_verdict(cmp.verdict, cmp.quality.get("passed"), aa)
    finally:
        if own_adapter:
            adapter.close()
    result["finished_at"] = time.time()
    result["wall_s"] = result["finished_at"] - t_start
    return result
