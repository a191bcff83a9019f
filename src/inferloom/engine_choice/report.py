"""``engines.md`` and ``engines.json``: the two sessions side by side, the cross-engine measurement, and which engine
to deploy (:mod:`inferloom.engine_choice.decide`). Every number is a session's own (cited by its ledger seq) or this
run's measurement (its pairs in ``engines_pairs.jsonl``)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Mapping, Sequence

from inferloom.engine_choice.decide import engine_decision, recommendation
from inferloom.engine_choice.sessions import EngineSession, machine_identity
from inferloom.redact import redact, redact_text
from inferloom.report.fmt import changes_text, number, ratio_x
from inferloom.session.atomic import write_json_atomic

__all__ = ["SCHEMA_VERSION", "build_result", "render_markdown", "write_report"]

SCHEMA_VERSION = 1


def build_result(sessions: Sequence[EngineSession], measurement: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-ready result: the sessions' rows, the measurement, the decision and the recommendation."""
    rows = {s.name: s.row() for s in sessions}
    dec = engine_decision(measurement)
    return {"schema_version": SCHEMA_VERSION, "workload": _workload(sessions[0]),
            "machine": machine_identity(sessions[0]), "sessions": rows, "measurement": dict(measurement),
            "decision": dec, "recommendation": recommendation(dec, rows, measurement.get("quality"))}


def _workload(s: EngineSession) -> str:
    t = s.spec.traffic
    shape = (f"trace {t.trace}" if t.trace else
             f"concurrency {t.concurrency}, {t.input_len} in / {t.output_len} out, {s.spec.requests_per_run} "
             "requests per run")
    return f"{s.spec.model}; {shape}; objective {s.spec.objective}; device {s.spec.resolved_device()}"


def _interval(r: Mapping[str, Any]) -> str:
    if not r.get("final_ci"):
        return "x1.000 (nothing kept: the final stack is stock)"
    lo, hi = r["final_ci"]
    return f"{ratio_x(r['final_ratio'])} [{ratio_x(lo)}, {ratio_x(hi)}] {r.get('final_verdict') or ''} (#{r['final_seq']})"


def _where_measured(m: Mapping[str, Any]) -> list[str]:
    """The pairs' machine and day when they differ from the sessions' (both lines end with a blank line)."""
    apart = m.get("measured_apart")
    if not apart:
        return []
    return [f"The pairs below ran apart from the sessions: {'; '.join(apart)}. The sessions' columns are their own "
            "measurements; the ratio between the engines is the pairs'.", ""]


def _pct(v: Any) -> str:
    return "n/a" if v is None else f"{number(100 * v, '.1f')}%"


def render_markdown(res: Mapping[str, Any]) -> str:
    m, d, rec = res["measurement"], res["decision"], res["recommendation"]
    unit = m.get("unit") or "output tok/s"
    out = ["# Engine choice", "", f"**{rec['headline']}.**", ""]
    out += [f"- {r}" for r in rec["reasons"]]
    out += ["", f"Workload: {res['workload']}.", "Machine: " + ", ".join(f"{k.split(' (')[0]} {v}" for k, v in
                                                                         res["machine"].items()) + ".", "",
            *_where_measured(m), "## The sessions (each one's own measurements)", "",
            f"| engine | stock median ({unit}) | final stack | final / stock [interval] | roofline (stock -> final) "
            "| precision | held-out quality |", "| --- | ---: | --- | --- | --- | --- | --- |"]
    for name, r in res["sessions"].items():
        q = {True: "passed", False: "FAILED", None: "n/a (stock)"}[r.get("quality_passed")]
        out.append(f"| {name} | {number(r['stock_median'])} (#{r['stock_seq']}) | "
                   f"{changes_text(r['final_changes']) or 'stock'} | {_interval(r)} | "
                   f"{_pct(r['roofline_stock'])} -> {_pct(r['roofline_final'])} | {r['precision']} | {q} |")
    out += ["", "The medians above were measured in two sessions, apart: they are not compared with each other. "
            "The comparison is the next section's.", "", "## The two final stacks, paired against each other", ""]
    look = (m.get("protocol") or {}).get("decision")
    if m.get("n_pairs") and not look:
        out.append(f"{m['n_pairs']} pair(s) completed before the measurement failed, before the protocol's first look: "
                   f"{m.get('error')}. Their raw records are in `{m['pairs_file']}`.")
    elif m.get("n_pairs"):
        va, vb = m["values_a"], m["values_b"]
        out += [f"A = {m['baseline']}, B = {m['candidate']} (the faster by the sessions' own medians, so the "
                "protocol's keep rule tests that expectation).", "",
                f"- {m['n_pairs']} interleaved pairs (AB, BA, ...), fresh prompts per pair (seed {m['seed_base']} + "
                f"pair index), {m['settings']['warmup_runs']} warm-up run(s) each, untimed",
                f"- medians: A {number(statistics.median(va))}, B {number(statistics.median(vb))} {unit}",
                f"- protocol: {m['verdict']}; B/A {ratio_x(look['ratio'])} [{ratio_x(look['ci_low'])}, "
                f"{ratio_x(look['ci_high'])}] ({look.get('reason') or look.get('stop') or ''})",
                f"- decision: {d['why']}",
                f"- raw records: `{m['pairs_file']}` (one line per pair: both runs' records, value_a, value_b, "
                "log_ratio; the decision re-derives from the log-ratios)"]
    else:
        out.append(f"No pair completed: {m.get('error')}.")
    q = m.get("quality")
    if q and q.get("evaluated"):
        out += ["", f"## Quality agreement ({q['reference']} as the reference)", "",
                "| set | top-1 agreement | mean KL (nats) | greedy agreement | verdict |", "| --- | ---: | ---: | ---: | --- |"]
        for s in q["sets"]:
            v = s["values"]
            out.append(f"| {s['set_name']} | {number(v.get('top1_agreement'), '.4f')} | "
                       f"{number(v.get('mean_kl'), '.4g')} | {number(v.get('greedy_agreement'), '.4f')} | "
                       f"{'agree' if s['passed'] else 'DIFFER: ' + s['message']} |")
    elif q:
        out += ["", f"Quality agreement: not evaluated ({q.get('why')})."]
    return redact_text("\n".join(out) + "\n")


def write_report(out: Path, res: Mapping[str, Any]) -> tuple[Path, Path]:
    """Write ``engines.json`` and ``engines.md`` into ``out`` (atomically); returns both paths."""
    j, md = out / "engines.json", out / "engines.md"
    write_json_atomic(j, redact(dict(res)))
    tmp = md.with_name(".engines.md.tmp")
    tmp.write_text(render_markdown(res), encoding="utf-8")
    tmp.replace(md)
    return j, md
