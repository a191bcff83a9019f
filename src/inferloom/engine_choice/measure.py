"""The cross-engine measurement: two sessions' final stacks, each on its own engine, paired against each other
through the protocol every comparison uses (:func:`inferloom.measure.compare.warmup` and
:func:`~inferloom.measure.compare.timed_pairs`: warm-ups recorded apart, interleaved AB / BA pairs on fresh prompts
from one seed per pair, the sequential decision), then the quality agreement of the two engines' outputs.

Comparing the medians two sessions measured apart is not a measurement (another process, another hour, another
machine state); this is. Orientation: the engine the sessions' own medians expect to be faster is the protocol's
candidate (B), the other its baseline (A), so its keep rule tests that expectation; the decision in both directions
is :func:`inferloom.engine_choice.decide.engine_decision`. The protocol settings are the first session's, its pair
budget capped by ``max_pairs``, with the noisier of the two sessions' A/A as the prior and floor
(:func:`inferloom.measure.protocol.with_prior`).

Every pair's raw records are appended, as they complete, to ``OUT/engines_pairs.jsonl`` (fsync'd, one JSON object
a line: a ``setup`` line, one ``pair`` line per pair with both runs' raw records and the look's decision, a
``remeasured`` line per pair measured again because a server JIT-compiled during it, in no decision, and a
``result`` line), so that the decision can be re-derived from the file alone
(:func:`inferloom.measure.protocol.decision_at` over the pairs' ``log_ratio``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from inferloom.bench import run_seed_base
from inferloom.engine_choice.sessions import EngineSession
from inferloom.evidence.remeasure import restore_engine_files
from inferloom.measure import protocol as proto
from inferloom.measure import quality as Q
from inferloom.measure import quality_floor as QF
from inferloom.measure.compare import timed_pairs, warmup
from inferloom.measure.keep_rule import aa_floor
from inferloom.measure.metrics import get_metric
from inferloom.redact import redact
from inferloom.spec import objective_label
from inferloom.workloads.base import AdapterError, ApproximateScores
from inferloom.workloads.registry import make_adapter
from inferloom.workloads.server_adapter import ServerAdapter
from inferloom.workloads.server_process import servers_cpu_seconds, wait_quiet

__all__ = ["PAIRS_FILE", "settings_for", "orient", "measure_engines", "quality_agreement"]

PAIRS_FILE = "engines_pairs.jsonl"
Progress = Callable[[str], None]


class _Lines:
    """An append-only JSONL file, each line written and fsync'd as it comes (the raw records survive a crash)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f = open(path, "a", encoding="utf-8")

    def write(self, kind: str, payload: Mapping[str, Any]) -> None:
        self._f.write(json.dumps(redact({"kind": kind, "ts": time.time(), **payload}), default=str) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


def _servers_of(adapter: Any) -> Callable[[], list[Any]]:
    """The live server processes ``adapter`` holds (none for an in-process engine)."""
    return adapter.live_servers if isinstance(adapter, ServerAdapter) else list


def quiet_neighbours(adapters: list[Any]) -> None:
    """Each server adapter's runs wait for the other engine's servers to be quiet too (after its own warm-up,
    as for its own idle servers) and count their CPU meanwhile: a vLLM CPU server's threads spin ~1 s after
    serving, which took a 2-core machine from the in-process engine's next run (measured: transformers at 112
    tok/s in the pairs against 1,001 in its own session, 2026-12-05)."""
    for i, ad in enumerate(adapters):
        if isinstance(ad, ServerAdapter):
            ad.neighbours = _servers_of(adapters[1 - i])


class _TwoEngines:
    """One ``run(handle, seed)`` over two adapters: each handle runs on the adapter that prepared it (what
    :func:`timed_pairs` calls, so both engines' runs go through the one paired loop). An engine without servers
    of its own (in process) first waits for the other engine's servers to be quiet, and its record says how
    long and how much CPU they used during the run (``quiet_wait``, ``idle_servers_cpu_s``); a server engine
    does both itself (:func:`quiet_neighbours`)."""

    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        self._by = {id(h): ad for ad, h in pairs}
        self._other = {id(h): pairs[1 - i][0] for i, (_ad, h) in enumerate(pairs)}

    def run(self, handle: Any, seed: int) -> Any:
        ad = self._by[id(handle)]
        if isinstance(ad, ServerAdapter):
            return ad.run(handle, seed)
        others = _servers_of(self._other[id(handle)])
        waited = wait_quiet(others())
        cpu0 = servers_cpu_seconds(others())
        rec = ad.run(handle, seed)
        rec.extra.update(quiet_wait=waited, idle_servers_cpu_s=servers_cpu_seconds(others()) - cpu0)
        return rec


def _noisier(a: EngineSession, b: EngineSession) -> dict[str, Any] | None:
    """The A/A noise block (the sessions' PRELUDE) with the larger floor, then the larger per-pair sd."""
    blocks = [n for n in (a.noise, b.noise) if n]
    if not blocks:
        return None
    return max(blocks, key=lambda n: (aa_floor(n), float(n.get("sd_log_ratio") or 0.0)))


def settings_for(a: EngineSession, b: EngineSession, max_pairs: int | None) -> proto.ProtocolSettings:
    """The protocol of the cross-engine pairs: ``a``'s spec's, at most ``max_pairs`` pairs, with the noisier
    session's A/A as prior and floor."""
    p = a.spec.protocol
    if max_pairs:
        p = p.model_copy(update={"max_pairs": max_pairs, "min_pairs": min(p.min_pairs, max_pairs),
                                 "pair_step": min(p.pair_step, max_pairs)})
    return proto.with_prior(proto.ProtocolSettings.from_spec(p), _noisier(a, b))


def orient(a: EngineSession, b: EngineSession) -> tuple[EngineSession, EngineSession]:
    """``(baseline, candidate)``: the candidate is the one whose final stack's median in its own session is
    higher (the expectation the pairs test); a tie keeps the order given."""
    return (b, a) if a.expected_median() > b.expected_median() else (a, b)


def quality_agreement(ref_s: EngineSession, ref_ad: Any, ref_h: Any, other_ad: Any, other_h: Any,
                      progress: Progress) -> dict[str, Any]:
    """The other engine's outputs against the reference engine's (its greedy continuations and teacher-forced
    log-probabilities on the reference session's eval and held-out prompts), judged by the reference session's
    contract over its own A/A floor. The reference is the first session's engine, unless only the other one's
    scores are exact (an in-process engine's full distribution against a server's top-k). Failures are data: a probe that raises, or two engines whose probes can't be
    compared (another vocabulary), give ``evaluated: False`` and why."""
    t0 = time.perf_counter()
    spec = ref_s.spec
    out: dict[str, Any] = {"reference": ref_s.name, "evaluated": False}
    try:
        sets = Q.quality_prompt_sets(spec, ref_ad)
        verdicts = []
        for name in ("eval", "heldout"):
            progress(f"quality: {ref_s.name}'s outputs on the {name} set ({len(sets[name])} prompts) as the reference")
            ref = Q.capture_reference(ref_ad, ref_h, name, sets[name], spec.quality.continuation_len)
            th, info = QF.apply_floor(Q.QualityThresholds.from_spec(spec.quality),
                                      ((ref_s.noise_floor or {}).get("quality") or {}).get(name))
            progress(f"quality: the other engine against it on the {name} set")
            v = Q.evaluate(other_ad, other_h, ref, th)
            v.details["thresholds"] = info
            verdicts.append(v)
    except Exception as exc:  # noqa: BLE001 - a probe that crashes, or shapes that differ: data, never a crash
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        out["why"] = f"the probes could not be compared: {type(exc).__name__}: {first}"
        progress(f"quality: {out['why']}")
    else:
        out.update({"evaluated": True, "agree": all(v.passed for v in verdicts),
                    "sets": [v.to_dict() for v in verdicts], "failed": [v.message for v in verdicts if not v.passed]})
    out["seconds"] = time.perf_counter() - t0
    return out


def measure_engines(a: EngineSession, b: EngineSession, out: Path, *, max_pairs: int | None = None,
                    progress: Progress = lambda _m: None,
                    make: Callable[[Any], Any] = make_adapter) -> dict[str, Any]:
    """Pair ``a``'s and ``b``'s final stacks (``make(spec)`` builds each engine's adapter); returns the
    measurement (JSON-ready: ``baseline``, ``candidate``, ``protocol`` without the pairs, ``verdict``,
    ``quality``, ``timings``, ``pairs_file``). A preparation or warm-up that fails is data (``verdict:
    failed``, ``error``)."""
    base, cand = orient(a, b)
    settings = settings_for(a, b, max_pairs)
    seed_base = run_seed_base(a.spec)
    labels = (base.framework, cand.framework) if base.framework != cand.framework else ("A", "B")
    for s in (base, cand):  # a written kernel or an engine overlay the final stack needs: checked before anything
        restore_engine_files(s.directory, s.spec, s.changes)
    lines = _Lines(out / PAIRS_FILE)
    res: dict[str, Any] = {"baseline": base.name, "candidate": cand.name, "labels": list(labels),
                           "baseline_session": str(base.directory), "candidate_session": str(cand.directory),
                           "baseline_config": base.final_config, "candidate_config": cand.final_config,
                           "settings": settings.to_dict(), "seed_base": seed_base, "pairs_file": PAIRS_FILE,
                           "unit": objective_label(a.spec)}
    lines.write("setup", res)
    progress(f"engines: {cand.name} (B, the faster by the sessions' own medians) against {base.name} (A), "
             f"{settings.min_pairs} to {settings.max_pairs} pairs; raw records -> {out / PAIRS_FILE}")
    made: list[tuple[Any, Any]] = []  # (adapter, handle or None)
    timings: dict[str, Any] = {}
    try:
        adapters = [make(s.spec) for s in (base, cand)]
        made.extend((ad, None) for ad in adapters)
        quiet_neighbours(adapters)
        for ad in adapters:  # both shares from the memory free before either server starts: one share each
            share = getattr(ad, "memory_share", None)
            if callable(share):
                share()
        for i, (s, label) in enumerate(((base, labels[0]), (cand, labels[1]))):
            progress(f"preparing {label}: {s.framework} with its final stack {s.changes or '(stock)'}")
            t1 = time.perf_counter()
            ad = adapters[i]
            made[i] = (ad, ad.prepare(dict(s.final_config)))
            timings[f"prepare_{label}_s"] = time.perf_counter() - t1
            timings[f"warmup_{label}"] = warmup(ad, made[i][1], settings.warmup_runs, seed_base - 1, label, progress)

        def on_pair(pair: Any, decision: Any) -> None:
            # a pair measured again (a server's JIT compile during it: the protocol's contract) is in no decision
            lines.write("remeasured" if getattr(pair, "remeasure", 0) else "pair",
                        {**pair.to_dict(), "decision": decision.to_dict() if decision else None})

        pres = timed_pairs(_TwoEngines(made), [made[0][1], made[1][1]], settings, seed_base, labels, progress,
                           on_pair, True, metric=get_metric(a.spec.objective), unit=res["unit"])
        timings["timed_runs_s"] = sum(p.a.wall_s + p.b.wall_s for p in pres.pairs + pres.remeasured)
        prot = pres.to_dict()
        prot.pop("pairs")  # each is in the pairs file, with its raw records
        res.update({"protocol": prot, "verdict": pres.verdict, "error": pres.error, "n_pairs": len(pres.pairs),
                    "values_a": [p.value_a for p in pres.pairs], "values_b": [p.value_b for p in pres.pairs]})
        if pres.verdict != "failed":
            (ad_a, h_a), (ad_b, h_b) = made if base is a else made[::-1]
            if isinstance(ad_a, ApproximateScores) and not isinstance(ad_b, ApproximateScores):
                # the exact distribution is the reference: a server's top-k rows (uniform tail) as the reference
                # would charge the other engine's true tail as disagreement (mean_kl)
                res["quality"] = quality_agreement(b, ad_b, h_b, ad_a, h_a, progress)
            else:
                res["quality"] = quality_agreement(a, ad_a, h_a, ad_b, h_b, progress)
    except AdapterError as exc:
        res.update({"verdict": "failed", "error": str(exc), "error_kind": exc.kind})
        progress(f"engines: failed: {exc}")
    finally:
        for ad, h in made:
            try:
                if h is not None:
                    ad.release(h)
                ad.close()
            except Exception:  # noqa: BLE001 - stopping an engine must not hide the measurement's own error
                pass
        res["timings"] = timings
        lines.write("result", {k: v for k, v in res.items() if k not in ("baseline_config", "candidate_config")})
        lines.close()
    return res
