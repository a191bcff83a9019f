"""One paired comparison inside a session: base vs candidate configuration,
through the measurement protocol, with the quality contract against stock's
reference outputs. Returns a JSON-able record for the ledger; never decides
keep / revert itself (the protocol's verdict is in the record).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from inferloom.bench import _compile_overhead, _timed_pairs, _warmup
from inferloom.measure import protocol as proto
from inferloom.measure import quality as Q
from inferloom.workloads.base import AdapterError

__all__ = ["References", "compare", "stock_references"]

Progress = Callable[[str], None]


class References:
    """Stock's quality references per prompt set, captured once per process
    (deterministic: the same stock configuration and prompts give the same
    outputs, so a resumed session recaptures identical references)."""

    def __init__(self) -> None:
        self.sets: dict[str, Q.Reference] = {}


def stock_references(adapter: Any, spec: Any, stock_cfg: Mapping[str, Any], names: tuple[str, ...],
                     refs: References, progress: Progress) -> References:
    missing = [n for n in names if n not in refs.sets]
    if not missing:
        return refs
    progress(f"quality: capturing stock's reference outputs ({', '.join(missing)})")
    sets = Q.quality_prompt_sets(spec, adapter)
    h = adapter.prepare(dict(stock_cfg))
    try:
        for n in missing:
            refs.sets[n] = Q.capture_reference(adapter, h, n, sets[n], spec.quality.continuation_len)
    finally:
        adapter.release(h)
    return refs


def compare(
    adapter: Any,
    spec: Any,
    base_cfg: Mapping[str, Any],
    cand_cfg: Mapping[str, Any],
    *,
    settings: proto.ProtocolSettings,
    seed_base: int,
    refs: References | None,
    quality_set: str | None,
    progress: Progress,
    stop_early: bool = True,
    labels: tuple[str, str] = ("base", "candidate"),
) -> dict[str, Any]:
    """Measure ``cand_cfg`` against ``base_cfg``. Failures are data: a
    preparation or warm-up failure gives ``verdict='failed'`` with the error."""
    t0 = time.perf_counter()
    out: dict[str, Any] = {"base_config": dict(base_cfg), "candidate_config": dict(cand_cfg), "seed_base": seed_base}
    handles: list[Any] = []
    try:
        try:
            timings: dict[str, Any] = {}
            for label, cfg in zip(labels, (base_cfg, cand_cfg)):
                t1 = time.perf_counter()
                handles.append(adapter.prepare(dict(cfg)))
                timings[f"prepare_{label}_s"] = time.perf_counter() - t1
            timings["warmup_base"] = _warmup(adapter, handles[0], settings.warmup_runs, seed_base - 1, labels[0], progress)
            timings["warmup_candidate"] = _warmup(adapter, handles[1], settings.warmup_runs, seed_base - 1, labels[1], progress)
        except AdapterError as exc:
            out.update(verdict="failed", error=str(exc), error_kind=exc.kind, quality={"evaluated": False})
            return out
        pres = _timed_pairs(adapter, handles, settings, seed_base, not stop_early, progress, None)
        out["protocol"] = pres.to_dict()
        out["verdict"] = pres.verdict
        if not stop_early and pres.verdict != "failed":
            out["noise"] = proto.noise_floor(pres)
        out["error"] = pres.error
        walls_a = [p.a.wall_s for p in pres.pairs if p.a.success]
        walls_b = [p.b.wall_s for p in pres.pairs if p.b.success]
        timings["compile_overhead_base_s"] = _compile_overhead(timings["warmup_base"], walls_a)
        timings["compile_overhead_candidate_s"] = _compile_overhead(timings["warmup_candidate"], walls_b)
        timings["timed_runs_s"] = sum(walls_a) + sum(walls_b)
        timings["warmup_s"] = sum(w["wall_s"] for w in timings["warmup_base"] + timings["warmup_candidate"])
        out["timings"] = timings
        q: dict[str, Any] = {"evaluated": False}
        if quality_set and refs is not None and pres.verdict != "failed":
            tq = time.perf_counter()
            th = Q.QualityThresholds.from_spec(spec.quality)
            v = Q.evaluate(adapter, handles[1], refs.sets[quality_set], th)
            q = {"evaluated": True, "set": quality_set, "passed": v.passed, "failed": [] if v.passed else [v.message],
                 "sets": [v.to_dict()], "seconds": time.perf_counter() - tq}
        out["quality"] = q
        return out
    finally:
        for h in handles:
            try:
                adapter.release(h)
            except Exception:  # noqa: BLE001 - release must not hide the real error
                pass
        out["wall_s"] = time.perf_counter() - t0
