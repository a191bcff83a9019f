"""A session's artifacts, ``session_breakdown.json`` and ``report.md``,
written at CLOSE (:mod:`inferloom.phases.close`). Both are pure functions of
the ledger (:func:`breakdown_from_ledger`), so ``inferloom report DIR``
re-renders them from the ledger alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inferloom.phases.common import median_objective
from inferloom.session import ledger as L
from inferloom.session.atomic import write_json_atomic

__all__ = ["BREAKDOWN_SCHEMA_VERSION", "breakdown_from_ledger", "render_report", "write_artifacts"]

BREAKDOWN_SCHEMA_VERSION = 1


def _decision(m: dict[str, Any]) -> dict[str, Any]:
    return (m.get("protocol") or {}).get("decision") or {}


def breakdown_from_ledger(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Everything in the breakdown comes from ledger entries; each number cites its seq."""
    meas = [e for e in entries if e["kind"] == L.MEASUREMENT]
    verdicts = [e for e in entries if e["kind"] == L.VERDICT]
    proposals = {e.get("trial"): e for e in entries if e["kind"] == L.PROPOSAL}
    refusals = [e for e in entries if e["kind"] == L.REFUSAL]
    close = next((e for e in entries if e["kind"] == L.CLOSE), None)
    stock = next((m for m in meas if m.get("action") == "measure_stock"), None)
    final = next((m for m in meas if m.get("action") == "final_compare"), None)
    out: dict[str, Any] = {"schema_version": BREAKDOWN_SCHEMA_VERSION}
    if stock and stock.get("protocol"):
        out["stock"] = {"objective_median": median_objective(stock, "value_a", "value_b"),
                        "noise": stock.get("noise"), "ledger_seq": stock["seq"]}
    if final and final.get("protocol"):
        d = _decision(final)
        q = final.get("quality") or {}
        out["final"] = {"objective_median": median_objective(final, "value_b"),
                        "stock_median_same_run": median_objective(final, "value_a"),
                        "ratio": d.get("ratio"), "ci_low": d.get("ci_low"), "ci_high": d.get("ci_high"),
                        "n_pairs": d.get("n_pairs"), "protocol_verdict": final.get("verdict"),
                        "quality_passed": q.get("passed") if q.get("evaluated") else None,
                        "quality_failed": q.get("failed", []), "ledger_seq": final["seq"]}
    else:
        out["final"] = {"ratio": 1.0, "note": "nothing was kept: the final stack is stock"}
    out["action_path"] = [{"trial": v["trial"], "cycle": v["cycle"], "changes": v["changes"], "ratio": v.get("ratio"),
                           "ci_low": v.get("ci_low"), "ci_high": v.get("ci_high"), "lesson": v.get("lesson"),
                           "quality_passed": v.get("quality_passed"), "ledger_seq": v["seq"]}
                          for v in verdicts if v.get("kept")]
    out["rejected"] = [{"trial": v["trial"], "changes": v["changes"], "outcome": v["outcome"], "ratio": v.get("ratio"),
                        "ci_low": v.get("ci_low"), "ci_high": v.get("ci_high"), "lesson": v.get("lesson"),
                        "ledger_seq": v["seq"]} for v in verdicts if not v.get("kept")]
    out["refusals"] = [{"rule": r["rule"], "why": r["why"], "agent": r.get("agent"), "ledger_seq": r["seq"]} for r in refusals]
    out["unscored_keep_count"] = sum(1 for v in verdicts if v.get("kept") and v.get("quality_passed") is None)
    out["predicted_vs_measured"] = [{"trial": v["trial"], "changes": v["changes"],
                                     "predicted_gain": (proposals.get(v["trial"]) or {}).get("predicted_gain"),
                                     "measured_ratio": v.get("ratio"), "ledger_seq": v["seq"]} for v in verdicts]
    bench = sum((m.get("timings") or {}).get("timed_runs_s", 0.0) for m in meas)
    comp = sum(max(0.0, (m.get("timings") or {}).get(k) or 0.0) for m in meas
               for k in ("compile_overhead_base_s", "compile_overhead_candidate_s"))
    warm = sum((m.get("timings") or {}).get("warmup_s", 0.0) for m in meas)
    quality = sum((m.get("quality") or {}).get("seconds", 0.0) for m in meas)
    total = close["elapsed_s"] if close else (entries[-1]["ts"] - entries[0]["ts"] if entries else 0.0)
    out["time_s"] = {"total": total, "benchmark_runs": bench, "compilation": comp,
                     "warmup_excluding_compilation": max(0.0, warm - comp), "quality_probes": quality,
                     "harness": max(0.0, total - bench - warm - quality)}
    out["stop_reason"] = close["stop_reason"] if close else None
    out["final_config"] = close["final_config"] if close else None
    out["stock_config"] = close["stock_config"] if close else None
    out["close_ledger_seq"] = close["seq"] if close else None
    out["sweep"] = [{"point": m.get("point"), "cycle": m.get("cycle"), "ratio": _decision(m).get("ratio"),
                     "ci_low": _decision(m).get("ci_low"), "ci_high": _decision(m).get("ci_high"),
                     "ledger_seq": m["seq"]} for m in meas if m.get("action") == "sweep"]
    prof = next((e for e in entries if e["kind"] == "profile"), None)
    if prof:
        p = prof.get("profile") or {}
        out["profile"] = {"categories": p.get("categories"), "top_ops": (p.get("top_ops") or [])[:8],
                          "wall_s": p.get("wall_s"), "error": p.get("error"), "ledger_seq": prof["seq"]}
    roofs = [e for e in entries if e["kind"] == "roofline"]
    if roofs:
        stock_r = next((e for e in roofs if "stock" in e), {})
        final_r = next((e for e in roofs if "final" in e), {})
        out["roofline"] = {"ceilings": stock_r.get("ceilings"), "stock": stock_r.get("stock"),
                           "final": final_r.get("final"), "amdahl": final_r.get("amdahl"),
                           "kept": [{"trial": e["kept"]["trial"], "cycle": e["kept"].get("cycle"),
                                     "changes": e["kept"].get("changes"), "roofline": e["kept"]["roofline"],
                                     "ledger_seq": e["seq"]} for e in roofs if "kept" in e],
                           "ledger_seqs": [e["seq"] for e in roofs],
                           "stock_seq": stock_r.get("seq"), "final_seq": final_r.get("seq")}
    look = next((e for e in entries if e["kind"] == "kb_lookup"), None)
    if look:
        r = look.get("result") or {}
        out["warm_replay"] = {"chosen": (r.get("chosen") or {}).get("id") if isinstance(r.get("chosen"), dict) else r.get("chosen"),
                              "confidence": r.get("confidence"), "ledger_seq": look["seq"],
                              "replayed": [v["seq"] for v in verdicts if v.get("agent") == "kb-replay"]}
    out["phases"] = [{"from": e.get("from"), "to": e.get("to"), "why": e.get("why") or e.get("reason"),
                      "ledger_seq": e["seq"]} for e in entries if e["kind"] == L.PHASE]
    from inferloom.patches.report import patch_breakdown

    out.update(patch_breakdown(entries))  # source patches and the rollback drill (custom workloads)
    return out


def _pct(r: float | None) -> str:
    return "n/a" if r is None else f"{(r - 1) * 100:+.1f}%"


def render_report(b: dict[str, Any]) -> str:
    lines = ["# inferloom session report", ""]
    s, f = b.get("stock") or {}, b.get("final") or {}
    unit = b.get("objective_label") or "output tok/s"
    if s:
        lines.append(f"- Stock: {s['objective_median']:,.1f} {unit} (median of the A/A runs; ledger #{s['ledger_seq']}).")
        nz = s.get("noise") or {}
        if nz:
            lines.append(f"- A/A (stock against a second stock instance): ratio {nz.get('ratio', float('nan')):.4f} "
                         f"[{nz.get('ci_low', float('nan')):.4f}, {nz.get('ci_high', float('nan')):.4f}] over {nz.get('n_pairs')} pairs; "
                         f"a keep's lower bound must clear {abs(nz.get('ratio', 1.0) - 1) * 100:.2f}% as well as the minimum gain "
                         f"(ledger #{s['ledger_seq']}).")
    if f.get("ledger_seq"):
        lines.append(f"- **Final stack vs stock: x{f['ratio']:.3f} ({_pct(f['ratio'])}), interval [{_pct(f['ci_low'])}, {_pct(f['ci_high'])}]**, "
                     f"{f['n_pairs']} pairs, protocol {f['protocol_verdict']}, held-out quality "
                     f"{'pass' if f['quality_passed'] else 'FAIL' if f['quality_passed'] is False else 'not evaluated'} "
                     f"({f['objective_median']:,.1f} vs {f['stock_median_same_run']:,.1f} {unit}; ledger #{f['ledger_seq']}).")
    else:
        lines.append("- Final stack = stock: nothing was kept.")
    lines.append(f"- Stop reason: {b.get('stop_reason')} (ledger #{b.get('close_ledger_seq')}).")
    lines.append(f"- Kept without a quality verdict (unscored): {b.get('unscored_keep_count', 0)}.")
    lines += ["", "## Kept, in order", ""]
    for a in b.get("action_path", []):
        lines.append(f"- trial {a['trial']} (cycle {a['cycle']}): `{_fmt(a['changes'])}` {_pct(a['ratio'])} "
                     f"[{_pct(a['ci_low'])}, {_pct(a['ci_high'])}] vs the stack before it (ledger #{a['ledger_seq']})")
    if not b.get("action_path"):
        lines.append("- nothing")
    lines += ["", "## Rejected, and why", ""]
    for r in b.get("rejected", []):
        lines.append(f"- trial {r['trial']}: `{_fmt(r['changes'])}`: {r['outcome']}, {_pct(r['ratio'])} "
                     f"[{_pct(r['ci_low'])}, {_pct(r['ci_high'])}]: {r['lesson']} (ledger #{r['ledger_seq']})")
    for r in b.get("refusals", []):
        lines.append(f"- refused ({r['rule']}) from {r['agent']}: {r['why']} (ledger #{r['ledger_seq']})")
    if b.get("sweep"):
        lines += ["", "## Sweep: final stack vs stock", "", "| cycle | concurrency | input len | ratio | interval | ledger |", "| --- | --- | --- | --- | --- | --- |"]
        for p in b["sweep"]:
            if p.get("ratio") is None:
                lines.append(f"| {p['cycle']} | {p['point'][0]} | {p['point'][1]} | failed | | #{p['ledger_seq']} |")
                continue
            lines.append(f"| {p['cycle']} | {p['point'][0]} | {p['point'][1]} | {p['ratio']:.3f} | "
                         f"[{p['ci_low']:.3f}, {p['ci_high']:.3f}] | #{p['ledger_seq']} |")
    rf = b.get("roofline") or {}
    if rf.get("stock"):
        st_, fi = rf["stock"], rf.get("final") or {}
        lines += ["", "## Roofline", ""]
        ce = rf.get("ceilings") or {}
        lines.append(f"- Ceilings: {ce.get('memory_bandwidth_bytes_per_s', 0) / 1e9:,.1f} GB/s memory, "
                     f"{ce.get('matmul_flops_per_s', 0) / 1e12:,.2f} TFLOP/s matmul ({ce.get('device_name')}, {ce.get('measured_at')}).")
        lines.append(f"- Stock: {st_['fraction'] * 100:.1f}% of the {st_['ceiling_tok_per_s']:,.0f} tok/s ceiling; "
                     f"headroom x{st_['headroom']:.2f} (ledger #{rf['ledger_seqs'][0]}).")
        for k in rf.get("kept") or []:
            r = k["roofline"]
            lines.append(f"- After trial {k['trial']} (kept `{_fmt(k.get('changes') or {})}`): "
                         f"{r['fraction'] * 100:.1f}% of the ceiling, headroom x{r['headroom']:.2f}"
                         + ("; **suspect: more than the roofline allows**" if r.get("suspect") else "")
                         + f" (ledger #{k['ledger_seq']}).")
        if fi:
            am = rf.get("amdahl") or {}
            lines.append(f"- Final stack: {fi['fraction'] * 100:.1f}% of the ceiling"
                         + ("; **suspect: more than the roofline allows**" if fi.get("suspect") or am.get("suspect") else "")
                         + f" (ledger #{rf.get('final_seq') or rf['ledger_seqs'][-1]}).")
    pr = b.get("profile") or {}
    if pr.get("categories"):
        lines += ["", f"## Profile of one stock run (ledger #{pr['ledger_seq']})", "", "| category | share | seconds |", "| --- | --- | --- |"]
        for name, cat in sorted(pr["categories"].items(), key=lambda kv: -kv[1].get("share", 0)):
            lines.append(f"| {cat.get('label', name)} | {cat.get('share', 0) * 100:.1f}% | {cat.get('seconds', 0):.3f} |")
    from inferloom.patches.report import patch_report_lines

    lines += patch_report_lines(b)
    t = b.get("time_s", {})
    lines += ["", "## Where the time went", ""]
    for k in ("total", "benchmark_runs", "compilation", "warmup_excluding_compilation", "quality_probes", "harness"):
        lines.append(f"- {k.replace('_', ' ')}: {t.get(k, 0.0):.1f} s")
    lines += ["", "## Predicted vs measured", ""]
    for p in b.get("predicted_vs_measured", []):
        pg = p["predicted_gain"]
        lines.append(f"- trial {p['trial']} `{_fmt(p['changes'])}`: predicted {'n/a' if pg is None else f'{pg * 100:+.0f}%'}, "
                     f"measured {_pct(p['measured_ratio'])} (ledger #{p['ledger_seq']})")
    return "\n".join(lines) + "\n"


def _fmt(changes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in changes.items())


def _objective_label(d: Path) -> str:
    """What the session's objective values are (from the manifest's spec)."""
    from inferloom.session.manifest import ManifestError, read_manifest
    from inferloom.spec import objective_label

    try:
        return objective_label(read_manifest(d).get("spec") or {})
    except (ManifestError, OSError, ValueError):
        return "output tok/s"


def write_artifacts(directory: Path | str) -> dict[str, Any]:
    """Write session_breakdown.json and report.md from the ledger alone."""
    d = Path(directory)
    b = breakdown_from_ledger(L.read_entries(d))
    b["objective_label"] = _objective_label(d)
    write_json_atomic(d / "session_breakdown.json", b)
    tmp = d / ".report.md.tmp"
    tmp.write_text(render_report(b))
    tmp.replace(d / "report.md")
    return b
