"""One paired comparison: base vs candidate configuration, through the
measurement protocol, with the quality contract against stock's reference
outputs. Used by `inferloom bench` and by every measuring step of a session.
Returns a :class:`~inferloom.measure.records.Comparison` (its ``as_dict()``
is the ledger's form); never decides keep / revert itself (the protocol's
verdict is in the record).

Order of work: prepare both configurations -> warm up each (compilation and
warm-up time recorded, never inside a timed run) -> interleaved timed pairs
-> quality probes (after timing, so they never disturb it).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from inferloom.frameworks import framework
from inferloom.measure import protocol as proto
from inferloom.measure.protocol_remeasure import jit_kernels
from inferloom.measure.batched_quality import batched_guard
from inferloom.measure import quality as Q
from inferloom.measure import quality_floor as QF
from inferloom.measure import task_gate as TG
from inferloom.measure.tolerance import tolerance_for
from inferloom.measure.metrics import get_metric, output_tokens_per_s
from inferloom.measure.records import Comparison
from inferloom.measure.reference_store import load_references, save_references
from inferloom.platform_audit import EnergyMeter, RaplMeter
from inferloom.spec import objective_label, WorkloadSpec
from inferloom.workloads.base import AdapterError, OwnObjective, OwnQualityGate, RunRecord, ServerReuse, resolve_config

__all__ = ["QUALITY_PROBE_FAILED", "References", "compare", "reference_sets", "stock_references", "warmup",
           "compile_overhead", "timed_pairs"]

Progress = Callable[[str], None]

# Rule named when the candidate's quality probe itself fails (raises): the
# candidate is rejected by the quality contract, fail-closed.
QUALITY_PROBE_FAILED = "quality_probe_failed"


class References:
    """Stock's quality references per prompt set, captured once per process
    (deterministic: the same stock configuration and prompts give the same
    outputs, so a resumed session recaptures identical references)."""

    def __init__(self, path: Path | None = None) -> None:
        self.sets: dict[str, Q.Reference] = {}
        self.config: dict[str, Any] | None = None  # the stock configuration they came from
        self.tasks: dict[str, TG.TaskReference] = {}  # stock's task-gate answers (quality.task)
        self.path = path  # a session's quality_refs.pt: loaded before capturing, written after (reference_store)


def reference_sets(adapter: Any, needed: Sequence[str]) -> tuple[str, ...]:
    """The reference sets to capture when ``needed`` are: with a server kept
    alive for reuse (``ServerReuse``), both sets at once, while stock's server
    is alive (stock's outputs only; no candidate is judged on the held-out set
    before CLOSE), so no stock server has to start again for them later."""
    return ("eval", "heldout") if isinstance(adapter, ServerReuse) else tuple(needed)


def stock_references(adapter: Any, spec: WorkloadSpec, stock_cfg: Mapping[str, Any], names: Sequence[str],
                     refs: References, progress: Progress, handle: Any = None) -> References:
    """Capture the missing references with ``handle`` (a prepared stock) or a fresh stock handle."""
    gate = spec.quality.task
    missing = [n for n in names if n not in refs.sets]
    tasks = [n for n in names if gate is not None and n not in refs.tasks]  # the task gate's answers: not stored
    if (not missing and not tasks) or isinstance(adapter, OwnQualityGate):  # the workload's own gate judges quality
        return refs
    if refs.path is not None and missing:  # a resumed session: the references it started with, if stock is the same
        stored = load_references(refs.path, stock_cfg, _probe(spec))
        if stored:
            refs.config = dict(stock_cfg)
            refs.sets.update({n: r for n, r in stored.items() if n not in refs.sets})
            missing = [n for n in names if n not in refs.sets]
            progress(f"quality: stock's reference outputs read from {refs.path.name}")
            if not missing and not tasks:
                return refs
    if missing:
        progress(f"quality: capturing stock's reference outputs ({', '.join(missing)})")
    refs.config = dict(stock_cfg)
    sets = Q.quality_prompt_sets(spec, adapter)
    h = handle if handle is not None else adapter.prepare(dict(stock_cfg))
    try:
        for n in missing:
            refs.sets[n] = Q.capture_reference(adapter, h, n, sets[n], spec.quality.continuation_len)
        if tasks:
            items = TG.load_task_items(gate.file)
            for n in tasks:
                progress(f"task gate: stock's answers on the {n} split ({len(items[n])} items)")
                refs.tasks[n] = TG.capture_task_reference(adapter, h, n, items[n], gate.max_new_tokens)
    finally:
        if handle is None:
            adapter.release(h)
    if refs.path is not None and missing:
        save_references(refs.path, stock_cfg, refs.sets, _probe(spec))
    return refs


def _probe(spec: WorkloadSpec) -> str:
    """How the references were probed (a server's: its prompts one request each, this many in flight)."""
    return f"quality.concurrency={spec.quality.concurrency}" if framework(spec.framework).server else ""


def warmup(adapter: Any, handle: Any, n: int, seed0: int, label: str, progress: Progress) -> list[dict[str, Any]]:
    """``n`` untimed runs; a failed one raises AdapterError (the configuration doesn't run)."""
    out = []
    for i in range(n):
        progress(f"warm-up {label} {i + 1}/{n} (compilation, if any, happens here)")
        rec: RunRecord = adapter.run(handle, seed0 - i)
        if not rec.success:
            raise AdapterError(f"{label} warm-up run failed: {rec.error}", kind=rec.extra.get("kind", "error"))
        out.append({"seed": rec.seed, "wall_s": rec.wall_s, "output_tokens_per_s": output_tokens_per_s(rec)})
    return out


def _warmed(adapter: Any, handle: Any, n: int) -> bool:
    """A server kept alive for reuse (``ServerReuse``) that already had ``n`` warm-up runs: its
    compilation and lazy set-up are behind it, and each timed run warms it again first (its warm-up
    requests); another engine's handles are warmed up every time."""
    notes = getattr(handle, "notes", None)
    return isinstance(adapter, ServerReuse) and isinstance(notes, dict) and notes.get("warmup_runs", 0) >= n


def _mark_warmed(adapter: Any, handle: Any, n: int) -> None:
    notes = getattr(handle, "notes", None)
    if isinstance(adapter, ServerReuse) and isinstance(notes, dict):
        notes["warmup_runs"] = max(n, notes.get("warmup_runs", 0))


def compile_overhead(warmups: list[dict[str, Any]], timed_walls: list[float]) -> float | None:
    """First warm-up wall time minus the median timed run: time spent compiling/loading lazily."""
    if not warmups or not timed_walls:
        return None
    return max(0.0, warmups[0]["wall_s"] - statistics.median(timed_walls))


def timed_pairs(adapter: Any, handles: list[Any], settings: Any, seed_base: int, labels: tuple[str, str],
                progress: Progress, on_pair: Callable[[Any, Any], None] | None = None,
                stop_early: bool = True, metric: Any = output_tokens_per_s, unit: str = "output tok/s") -> Any:
    h_a, h_b = handles

    def _on_pair(pair: Any, decision: Any) -> None:
        va = f"{pair.value_a:,.1f}" if pair.value_a is not None else "failed"
        vb = f"{pair.value_b:,.1f}" if pair.value_b is not None else "failed"
        tail = (f" -> {decision.verdict}, ratio {decision.ratio:.4f} "
                f"[{decision.ci_low:.4f}, {decision.ci_high:.4f}]") if decision else ""
        jit = [f"{lab} {', '.join(sorted(set(ks)))}" for lab, r in zip(labels, (pair.a, pair.b)) if (ks := jit_kernels(r))]
        said = f" (its server's log: JIT compile during the run: {'; '.join(jit)}; {_jit_fate(pair, settings)})" \
            if jit else ""
        progress(f"pair {pair.index + 1}/{settings.max_pairs} ({pair.order}): {labels[0]} {va} vs {labels[1]} {vb} "
                 f"{unit}{tail}{said}")
        if on_pair:
            on_pair(pair, decision)

    # an adapter with its own objective (a custom workload) supplies the metric
    metric = adapter.objective_metric if isinstance(adapter, OwnObjective) else metric
    # the GPUs' (NVML) and the CPU packages' (RAPL) energy per timed run, in the run's raw record (where readable)
    meters = [m for m in (EnergyMeter.open(), RaplMeter.open()) if m is not None]

    def run(h: Any, s: int) -> Any:
        energy: dict[str, Any] = {}

        def call(i: int = 0) -> Any:  # the meters nested: each one's reading spans the run
            if i == len(meters):
                return adapter.run(h, s)
            res, reading = meters[i].measure(lambda: call(i + 1))
            energy.update(reading)
            return res

        rec = call()
        if energy and getattr(rec, "success", False) and isinstance(getattr(rec, "extra", None), dict):
            rec.extra.update(energy)
        return rec

    return proto.run_paired(lambda s: run(h_a, s), lambda s: run(h_b, s), settings,
                            seed_base=seed_base, on_pair=_on_pair, stop_early=stop_early, metric=metric)


def _jit_fate(pair: Any, settings: Any) -> str:
    """What the protocol did with a pair whose server JIT-compiled during a run (``protocol``'s contract)."""
    n = getattr(settings, "jit_remeasures", 0)
    if getattr(pair, "remeasure", 0):
        return f"measured again, not in the decision: a compile is warm-up, {pair.remeasure} of {n}"
    return f"counted: the {n} re-measure{'s are' if n != 1 else ' is'} used" if n else \
        "counted: protocol.jit_remeasures is 0"


def _stock_config(adapter: Any, spec: Any) -> dict[str, Any]:
    """Stock's knob values (each knob's default, the spec's pinned values over them)."""
    return resolve_config(adapter.knob_space(), {}, getattr(spec, "pinned", {}) or {})


def compare(
    adapter: Any,
    spec: Any,
    base_cfg: Mapping[str, Any],
    cand_cfg: Mapping[str, Any],
    *,
    settings: proto.ProtocolSettings,
    seed_base: int,
    refs: References | None,
    quality_sets: Sequence[str] = (),
    progress: Progress,
    stop_early: bool = True,
    labels: tuple[str, str] = ("base", "candidate"),
    on_pair: Callable[[Any, Any], None] | None = None,
    stock_is_base: bool = False,
    quality_floor: Mapping[str, Mapping[str, float]] | None = None,
) -> Comparison:
    """Measure ``cand_cfg`` against ``base_cfg``. Failures are data: a
    preparation or warm-up failure gives ``verdict='failed'`` with the error.
    With ``stop_early=False`` (A/A) every planned pair runs and ``noise`` is
    reported. Quality is judged on each of ``quality_sets`` against ``refs``
    (captured from the base handle when ``stock_is_base`` and missing), with
    the thresholds relaxed per set by ``quality_floor`` (the server's own A/A
    values per set: ``measure.quality_floor``) over the tolerance declared for
    the candidate (``quality.numerics`` when it changes a numerics knob from
    stock: ``measure.tolerance``)."""
    t0 = time.perf_counter()
    handles: list[Any] = []
    if isinstance(adapter, ServerReuse):  # the servers kept alive: these two are the ones to keep
        adapter.expect_servers([dict(base_cfg), dict(cand_cfg)])
    try:
        fields = _measure(adapter, spec, base_cfg, cand_cfg, handles, settings=settings, seed_base=seed_base,
                          refs=refs, quality_sets=quality_sets, progress=progress, stop_early=stop_early,
                          labels=labels, on_pair=on_pair, stock_is_base=stock_is_base, quality_floor=quality_floor)
    finally:
        for h in handles:
            try:
                adapter.release(h)
            except Exception:  # noqa: BLE001 - release must not hide the real error
                pass
    return Comparison(base_config=dict(base_cfg), candidate_config=dict(cand_cfg), seed_base=seed_base, **fields,
                      wall_s=time.perf_counter() - t0)


def _measure(adapter: Any, spec: Any, base_cfg: Mapping[str, Any], cand_cfg: Mapping[str, Any], handles: list[Any],
             *, settings: proto.ProtocolSettings, seed_base: int, refs: References | None,
             quality_sets: Sequence[str], progress: Progress, stop_early: bool, labels: tuple[str, str],
             on_pair: Callable[[Any, Any], None] | None, stock_is_base: bool,
             quality_floor: Mapping[str, Mapping[str, float]] | None) -> dict[str, Any]:
    """compare()'s work, the handles it prepares appended to ``handles`` (compare() releases them):
    the :class:`Comparison`'s fields but the configurations, the seed and the wall time."""
    timings: dict[str, Any] = {}
    try:
        for label, cfg in zip(labels, (base_cfg, cand_cfg)):
            progress(f"preparing {label}")
            t1 = time.perf_counter()
            handles.append(adapter.prepare(dict(cfg)))
            timings[f"prepare_{label}_s"] = time.perf_counter() - t1
        for key, h, label in (("warmup_base", handles[0], labels[0]), ("warmup_candidate", handles[1], labels[1])):
            if _warmed(adapter, h, settings.warmup_runs):  # a reused server, warmed in an earlier comparison
                progress(f"warm-up {label}: skipped (its server was warmed up and measured before)")
                timings[key], timings[f"{key}_skipped"] = [], "reused server, warmed up in an earlier comparison"
                continue
            timings[key] = warmup(adapter, h, settings.warmup_runs, seed_base - 1, label, progress)
            _mark_warmed(adapter, h, settings.warmup_runs)
    except AdapterError as exc:
        return {"verdict": "failed", "error": str(exc), "error_kind": exc.kind, "quality": {"evaluated": False},
                "timings": timings}
    pres = timed_pairs(adapter, handles, settings, seed_base, labels, progress, on_pair, stop_early,
                       metric=get_metric(getattr(spec, "objective", "output_tokens_per_s")),
                       unit=objective_label(spec) if spec is not None else "output tok/s")
    out: dict[str, Any] = {"protocol": pres.to_dict(), "verdict": pres.verdict, "error": pres.error}
    if not stop_early and pres.verdict != "failed":
        out["noise"] = proto.noise_floor(pres)
    walls_a = [p.a.wall_s for p in pres.pairs if p.a.success]
    walls_b = [p.b.wall_s for p in pres.pairs if p.b.success]
    timings["compile_overhead_base_s"] = compile_overhead(timings["warmup_base"], walls_a)
    timings["compile_overhead_candidate_s"] = compile_overhead(timings["warmup_candidate"], walls_b)
    # the pairs measured again (a server's JIT compile) were timed runs too: their time is the benchmark's
    timings["timed_runs_s"] = sum(walls_a) + sum(walls_b) + sum(p.a.wall_s + p.b.wall_s for p in pres.remeasured)
    timings["warmup_s"] = sum(w["wall_s"] for w in timings["warmup_base"] + timings["warmup_candidate"])
    out["timings"] = timings
    out["quality"] = _quality(adapter, spec, base_cfg, cand_cfg, handles, pres, refs=refs, quality_sets=quality_sets,
                              progress=progress, labels=labels, stock_is_base=stock_is_base,
                              quality_floor=quality_floor)
    return out


def _quality(adapter: Any, spec: Any, base_cfg: Mapping[str, Any], cand_cfg: Mapping[str, Any], handles: list[Any],
             pres: Any, *, refs: References | None, quality_sets: Sequence[str], progress: Progress,
             labels: tuple[str, str], stock_is_base: bool,
             quality_floor: Mapping[str, Mapping[str, float]] | None) -> dict[str, Any]:
    """The quality contract's result for the candidate (``handles[1]``), after its timed pairs."""
    q: dict[str, Any] = {"evaluated": False}
    if isinstance(adapter, OwnQualityGate) and quality_sets and pres.verdict != "failed":
        # a custom workload's own quality gate, fail-closed, over the candidate's timed runs
        q = adapter.gate_quality([p.b for p in pres.pairs])
        if not q["passed"]:
            progress(f"quality gate: {labels[1]} rejected: {'; '.join(q['failed'])}")
    elif quality_sets and refs is not None and pres.verdict != "failed":
        tq = time.perf_counter()
        if stock_is_base:
            stock_references(adapter, spec, base_cfg, quality_sets, refs, progress, handle=handles[0])
        th, tolerance = tolerance_for(spec.quality, _stock_config(adapter, spec), cand_cfg)
        verdicts = []
        try:
            for name in quality_sets:
                progress(f"quality contract: {labels[1]} against stock's reference on the {name} set "
                         f"({tolerance['name']} tolerance)")
                th_set, floor_info = QF.apply_floor(th, (quality_floor or {}).get(name))  # the A/A floor
                v = Q.evaluate(adapter, handles[1], refs.sets[name], th_set)
                v = batched_guard(adapter, handles[1], refs.sets[name], v,  # a server's batched paths
                                  lambda r=refs.sets[name], t=th_set: Q.effective_tie_margin(r, t))
                v.details["tolerance"] = tolerance
                v.details["thresholds"] = {**floor_info, "tolerance": tolerance["name"]}
                if name in refs.tasks:
                    v = TG.merge_task(v, TG.evaluate_task(adapter, handles[1], refs.tasks[name], spec.quality.task))
                verdicts.append(v)
        except Exception as exc:  # noqa: BLE001 - a probe that crashes is a failed contract, never a crash
            # e.g. on CUDA a forced SDPA kernel that runs the timed (unpadded) batches but has
            # no kernel for the padded quality prompts' attention mask.
            msg = f"{QUALITY_PROBE_FAILED}: the quality probe raised {type(exc).__name__}: " + \
                (str(exc).strip().splitlines() or [""])[0][:500]
            progress(msg)
            q = {"evaluated": True, "passed": False, "rule": QUALITY_PROBE_FAILED, "error": msg,
                 "sets": [v.to_dict() for v in verdicts], "failed": [msg], "seconds": time.perf_counter() - tq}
        else:
            q = {"evaluated": True, "passed": all(v.passed for v in verdicts), "tolerance": tolerance,
                 "sets": [v.to_dict() for v in verdicts],
                 "failed": [v.message for v in verdicts if not v.passed], "seconds": time.perf_counter() - tq}
    return q
