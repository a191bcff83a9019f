"""`inferloom bench`: stock vs one candidate (or stock vs stock, A/A) through the
measurement protocol and the quality contract, with a JSON result.

Order of work: prepare both configurations -> warm up each (compilation and
warm-up time recorded, never inside a timed run) -> interleaved timed pairs
(``measure.protocol``) -> quality probes (after timing, so they never disturb
it) -> result. The only keep / revert decision comes from the protocol; the
quality contract can veto it.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from inferloom.measure import protocol as proto
from inferloom.measure import quality as Q
from inferloom.measure.metrics import output_tokens_per_s
from inferloom.provenance import environment
from inferloom.spec import WorkloadSpec, spec_hash
from inferloom.workloads.base import AdapterError, ConfigError, RunRecord, config_key, resolve_config

__all__ = ["SCHEMA_VERSION", "run_bench", "run_seed_base", "write_json_atomic", "overall_verdict"]

SCHEMA_VERSION = 1
Progress = Callable[[str], None]


def run_seed_base(spec: WorkloadSpec) -> int:
    """Timed runs draw prompts from seed_base + pair index; warm-ups below it."""
    return spec.seed * 1_000_003 + 1_000


def write_json_atomic(path: Path, data: Any) -> None:
    """Temp file, fsync, rename: a reader never sees a half-written result."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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


def _warmup(adapter: Any, handle: Any, n: int, seed0: int, label: str, progress: Progress) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        progress(f"warm-up {label} {i + 1}/{n} (compilation, if any, happens here)")
        rec: RunRecord = adapter.run(handle, seed0 - i)
        if not rec.success:
            raise AdapterError(f"{label} warm-up run failed: {rec.error}", kind=rec.extra.get("kind", "error"))
        out.append({"seed": rec.seed, "wall_s": rec.wall_s, "output_tokens_per_s": output_tokens_per_s(rec)})
    return out


def _compile_overhead(warmups: list[dict[str, Any]], timed_walls: list[float]) -> float | None:
    """First warm-up wall time minus the median timed run: time spent compiling/loading lazily."""
    if not warmups or not timed_walls:
        return None
    return max(0.0, warmups[0]["wall_s"] - statistics.median(timed_walls))


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
    from inferloom.workloads.registry import make_adapter

    t_start = time.time()
    candidate = dict(candidate or {})
    if aa and candidate:
        raise ConfigError("--aa measures stock against itself; it takes no --candidate")
    own_adapter = adapter is None
    adapter = adapter if adapter is not None else make_adapter(spec)
    settings = proto.ProtocolSettings.from_spec(spec.protocol)
    knobs = adapter.knob_space()
    stock_cfg = resolve_config(knobs, {}, spec.pinned)
    cand_cfg = resolve_config(knobs, candidate, spec.pinned)
    if not aa and cand_cfg == stock_cfg:
        raise ConfigError("the candidate equals the stock configuration; give at least one --candidate key=value that differs")
    progress(f"workload: {spec.model}, device {spec.resolved_device()}, dtype {spec.dtype}, "
             f"concurrency {spec.traffic.concurrency}, {spec.traffic.input_len} in / {spec.traffic.output_len} out"
             + (f"; result -> {out_hint}" if out_hint else ""))
    numerics = sorted(k.name for k in knobs if k.changes_numerics and cand_cfg[k.name] != stock_cfg[k.name])
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
        "numerics_changing_knobs": numerics,
        "environment": environment(),
    }
    handles: list[Any] = []
    try:
        b_label = "stock-2" if aa else "candidate"
        try:
            timings: dict[str, Any] = {}
            for label, cfg in (("stock", stock_cfg), (b_label, cand_cfg)):
                changed = {k: v for k, v in cfg.items() if v != stock_cfg[k]}
                progress(f"preparing {label}: {config_key(changed) or 'stock configuration'}")
                t0 = time.perf_counter()
                handles.append(adapter.prepare(cfg))
                timings[f"prepare_{label}_s"] = time.perf_counter() - t0
            seed_base = run_seed_base(spec)
            timings["warmup_stock"] = _warmup(adapter, handles[0], settings.warmup_runs, seed_base - 1, "stock", progress)
            timings["warmup_candidate"] = _warmup(adapter, handles[1], settings.warmup_runs, seed_base - 1, b_label, progress)
        except AdapterError as exc:
            # A configuration that can't be prepared or warmed up is a result too.
            result.update(verdict="failed", error=str(exc), error_kind=exc.kind, quality={"evaluated": False})
            return result
        pres = _timed_pairs(adapter, handles, settings, seed_base, aa, progress, on_pair)
        result["protocol"] = pres.to_dict()
        walls_a = [p.a.wall_s for p in pres.pairs if p.a.success]
        walls_b = [p.b.wall_s for p in pres.pairs if p.b.success]
        timings["compile_overhead_stock_s"] = _compile_overhead(timings["warmup_stock"], walls_a)
        timings["compile_overhead_candidate_s"] = _compile_overhead(timings["warmup_candidate"], walls_b)
        timings["timed_runs_s"] = sum(walls_a) + sum(walls_b)
        result["timings"] = timings
        if aa:
            result["noise"] = proto.noise_floor(pres)
        qres: dict[str, Any] = {"evaluated": False}
        if quality and pres.verdict != "failed":
            qres = _quality(spec, adapter, handles, b_label, progress)
        result["quality"] = qres
        result["verdict"] = overall_verdict(pres.verdict, qres.get("passed"), aa)
        result["error"] = pres.error
    finally:
        for h in handles:
            try:
                adapter.release(h)
            except Exception:  # noqa: BLE001 - release must not hide the real error
                pass
        if own_adapter:
            adapter.close()
        result["finished_at"] = time.time()
        result["wall_s"] = result["finished_at"] - t_start
    return result


def _timed_pairs(adapter: Any, handles: list[Any], settings: Any, seed_base: int, aa: bool,
                 progress: Progress, on_pair: Callable[[Any, Any], None] | None) -> Any:
    h_a, h_b = handles
    b_label = "stock-2" if aa else "candidate"

    def _on_pair(pair: Any, decision: Any) -> None:
        va = f"{pair.value_a:,.1f}" if pair.value_a is not None else "failed"
        vb = f"{pair.value_b:,.1f}" if pair.value_b is not None else "failed"
        tail = (f" -> {decision.verdict}, ratio {decision.ratio:.4f} "
                f"[{decision.ci_low:.4f}, {decision.ci_high:.4f}]") if decision else ""
        progress(f"pair {pair.index + 1}/{settings.max_pairs} ({pair.order}): stock {va} vs {b_label} {vb} tok/s{tail}")
        if on_pair:
            on_pair(pair, decision)

    return proto.run_paired(
        lambda s: adapter.run(h_a, s), lambda s: adapter.run(h_b, s), settings,
        seed_base=seed_base, on_pair=_on_pair,
        # A/A runs every planned pair: an early stop would leave a poor noise estimate.
        stop_early=not aa,
    )


def _quality(spec: WorkloadSpec, adapter: Any, handles: list[Any], b_label: str, progress: Progress) -> dict[str, Any]:
    """Stock's outputs are the reference; the candidate is judged on both sets."""
    t0 = time.perf_counter()
    th = Q.QualityThresholds.from_spec(spec.quality)
    sets = Q.quality_prompt_sets(spec, adapter)
    verdicts = []
    for name, prompts in sets.items():
        progress(f"quality contract: stock reference and {b_label} probes on the {name} set ({len(prompts)} prompts)")
        ref = Q.capture_reference(adapter, handles[0], name, prompts, spec.quality.continuation_len)
        verdicts.append(Q.evaluate(adapter, handles[1], ref, th))
    return {
        "evaluated": True,
        "passed": all(v.passed for v in verdicts),
        "sets": [v.to_dict() for v in verdicts],
        "failed": [v.message for v in verdicts if not v.passed],
        "seconds": time.perf_counter() - t0,
    }
