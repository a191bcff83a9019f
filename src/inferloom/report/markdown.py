"""``report.md``: the session report in Markdown, a pure function of the
breakdown (:mod:`inferloom.report.breakdown`); every number cites its ledger
entry (``ledger #N``)."""

from __future__ import annotations

from typing import Any

from inferloom.report.breakdown import TIME_CATEGORIES
from inferloom.report.deploy import deploy_lines
from inferloom.report.fmt import changes_text, pct, sandbox_text
from inferloom.report.platform import platform_lines
from inferloom.report.server_jit import jit_lines
from inferloom.report.llm_usage import llm_report_lines

__all__ = ["render_report", "patch_report_lines", "stock_never_ran_title"]


def render_report(b: dict[str, Any], deploy: dict[str, Any] | None = None) -> str:
    """``report.md`` from a breakdown (:func:`inferloom.report.breakdown.breakdown_from_ledger`); ``deploy``:
    the Deploy section's dict (:func:`inferloom.report.deploy.session_deploy`; None: no section)."""
    never = b.get("stock_never_ran")
    lines = [stock_never_ran_title(never) if never else "# inferloom session report", ""]
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
        lines.append(f"- **Final stack vs stock: x{f['ratio']:.3f} ({pct(f['ratio'])}), interval [{pct(f['ci_low'])}, {pct(f['ci_high'])}]**, "
                     f"{f['n_pairs']} pairs, protocol {f['protocol_verdict']}, held-out quality "
                     f"{'pass' if f['quality_passed'] else 'FAIL' if f['quality_passed'] is False else 'not evaluated'} "
                     + (f"against the {f['quality_tolerance']} " if f.get("quality_tolerance") else "") +
                     f"({f['objective_median']:,.1f} vs {f['stock_median_same_run']:,.1f} {unit}; ledger #{f['ledger_seq']}).")
    elif never:
        lines.append("- Nothing was measured against stock: no baseline, no A/A noise floor, nothing kept "
                     f"(the session exits 1; ledger #{never.get('ledger_seq')}).")
    else:
        lines.append("- Final stack = stock: nothing was kept.")
    lines.append(f"- Stop reason: {b.get('stop_reason')} (ledger #{b.get('close_ledger_seq')}).")
    lines.append(f"- Kept without a quality verdict (unscored): {b.get('unscored_keep_count', 0)}.")
    kf = b.get("kb_write_failed")
    if kf:
        lines.append(f"- **Not filed in the knowledge base**: {kf.get('error')}; {kf.get('todo')} (ledger #{kf.get('ledger_seq')}).")
    lines += platform_lines(b.get("platform"))
    lines += jit_lines(b.get("server_jit_runs"))
    if b.get("enablement"):  # stock failed: the ladder's rungs (docs/enablement.md)
        lines += ["", "## Enablement: stock failed, the ladder", ""]
        lines += [f"- rung {r['rung']} ({r['name']})" + (f" `{r['candidate']}`" if r.get("candidate") else "")
                  + (f", start {r['start']}" if r.get("start") else "")
                  + (", two servers side by side" if r.get("pair") else "")
                  + (f", {r['duration_s']:.1f} s" if r.get("duration_s") is not None else "")
                  + f": {str(r.get('outcome'))[:300]} (ledger #{r['ledger_seq']})" for r in b["enablement"]]
    lines += ["", "## Kept, in order", ""]
    for a in b.get("action_path", []):
        lines.append(f"- trial {a['trial']} (cycle {a['cycle']}): `{changes_text(a['changes'])}` {pct(a['ratio'])} "
                     f"[{pct(a['ci_low'])}, {pct(a['ci_high'])}] vs the stack before it"
                     + (f", quality passed the {a['quality_tolerance']}" if a.get("quality_tolerance") else "")
                     + f" (ledger #{a['ledger_seq']})")
    if not b.get("action_path"):
        lines.append("- nothing")
    lines += ["", "## Rejected, and why", ""]
    for r in b.get("rejected", []):
        lines.append(f"- trial {r['trial']}: `{changes_text(r['changes'])}`: {r['outcome']}, {pct(r['ratio'])} "
                     f"[{pct(r['ci_low'])}, {pct(r['ci_high'])}]: {r['lesson']} (ledger #{r['ledger_seq']})")
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
        ceil_txt = (f"{st_['ceiling_tok_per_s']:,.4g} images/s" if unit == "images/s"
                    else f"{st_['ceiling_tok_per_s']:,.0f} tok/s")
        lines.append(f"- Stock: {st_['fraction'] * 100:.1f}% of the {ceil_txt} ceiling; "
                     f"headroom x{st_['headroom']:.2f} (ledger #{rf['ledger_seqs'][0]}).")
        for k in rf.get("kept") or []:
            r = k["roofline"]
            lines.append(f"- After trial {k['trial']} (kept `{changes_text(k.get('changes') or {})}`): "
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
    lines += patch_report_lines(b)
    lines += deploy_lines(None if never else deploy)  # stock never ran: nothing to deploy
    lines += llm_report_lines(b)
    t = b.get("time_s", {})
    lines += ["", "## Where the time went", ""]
    for k in (k for k in TIME_CATEGORIES if k in t or k != "server_startup"):
        lines.append(f"- {k.replace('_', ' ')}: {t.get(k, 0.0):.1f} s")
    sv = b.get("servers")
    if sv:
        lines.append(f"- servers started: {sv['starts']} ({sv['restarts']} restarts, {sv['failed']} failed; compile "
                     f"cache warm {sv['compile_cache_warm']}, cold {sv['compile_cache_cold']}; ledger "
                     + ", ".join(f"#{s['ledger_seq']}" for s in sv["list"][:12]) + ("..." if len(sv["list"]) > 12 else "")
                     + ")")
        if sv.get("split_s"):  # from each server's own log lines (workloads/vllm_startup.py)
            lines.append(f"- server start-up split, over the {sv['split_starts']} starts whose log said: "
                         + ", ".join(f"{k.replace('_', ' ')} {v:.1f} s" for k, v in sv["split_s"].items())
                         + "; per start: " + "; ".join(f"{s['handle']} {s['startup_s']:.0f} s" + (
                             f" ({', '.join(f'{k} {v:.0f}' for k, v in s['split'].items())})" if s.get("split") else "")
                             for s in sv["list"][:12]))
        if sv.get("stock_runs"):
            r = sv["stock_runs"]
            lines.append("- the stock server's log says it runs " + ", ".join(f"`{k}={v}`" for k, v in r["values"].items())
                         + f" (ledger #{r['ledger_seq']}): a candidate setting one of them is the same server, never proposed")
    lines += ["", "## Predicted vs measured", ""]
    for p in b.get("predicted_vs_measured", []):
        pg = p["predicted_gain"]
        lines.append(f"- trial {p['trial']} `{changes_text(p['changes'])}`: predicted {'n/a' if pg is None else f'{pg * 100:+.0f}%'}, "
                     f"measured {pct(p['measured_ratio'])} (ledger #{p['ledger_seq']})")
    return "\n".join(lines) + "\n"


def stock_never_ran_title(never: dict[str, Any]) -> str:
    """The first line of the report of a session that never measured stock: that, and why."""
    return f"# inferloom session report: stock never ran: {never.get('why')} (ledger #{never.get('ledger_seq')})"


def patch_report_lines(b: dict[str, Any]) -> list[str]:
    """The source-patch section of ``report.md`` (custom workloads); empty for other sessions."""
    if "patches" not in b and "rollback_drill" not in b:
        return []
    engine = any(p.get("engine") for p in b.get("patches", []))
    lines = ["", "## Engine source patches (serving.engine_patches)" if engine else "## Source patches (custom workload)",
             ""]
    if b.get("objective_unit") is not None:
        lines.append(f"- Objective unit (from the entrypoint's results): {b['objective_unit'] or '(none given)'}.")
    if b.get("sandbox"):
        head, detail = sandbox_text(b["sandbox"])
        lines.append(f"- **{head}**: {detail} (ledger #{b['sandbox']['ledger_seq']}).")
    for p in b.get("patches", []):
        if p.get("kept"):
            where = (f"the overlay {str((p.get('overlay') or {}).get('digest'))[:12]}" if p.get("engine") else
                     f"commit {str(p.get('commit'))[:10]}")
            lines.append(f"- `{p['id']}` ({p['title']}): **kept** as {where}, "
                         f"{pct(p.get('ratio'))} [{pct(p.get('ci_low'))}, {pct(p.get('ci_high'))}] (ledger #{p['ledger_seq']})")
        elif p.get("gate") == "measure":
            why = "; ".join(p.get("quality_failed") or []) or p.get("outcome")
            lines.append(f"- `{p['id']}` ({p['title']}): rejected after measurement"
                         + (f" by rule **{p['rule']}**" if p.get("rule") else f" ({p.get('outcome')})")
                         + f", {pct(p.get('ratio'))} [{pct(p.get('ci_low'))}, {pct(p.get('ci_high'))}]: {why} "
                         f"(ledger #{p['ledger_seq']})")
        else:
            lines.append(f"- `{p['id']}` ({p['title']}): refused at gate {p.get('gate')} by rule **{p.get('rule')}**: "
                         f"{p.get('why')} (ledger #{p['ledger_seq']})")
    d = b.get("rollback_drill")
    if d:
        what = (f"dropped {', '.join(d.get('reverted') or [])} (a stock start without the overlay), installed "
                f"files unchanged: {d.get('tree_identical')}" if d.get("engine_patch") else
                f"reverted {len(d.get('reverted') or [])} commit(s), tree identical to stock: {d.get('tree_identical')}")
        lines.append(f"- Rollback drill: **{'passed' if d.get('passed') else 'FAILED'}**: {d.get('why')}; {what}, "
                     f"rolled-back vs stock {pct(d.get('ratio'))} [{pct(d.get('ci_low'))}, {pct(d.get('ci_high'))}], "
                     + (f"stock's own band [{pct(d['band'][0])}, {pct(d['band'][1])}] " if d.get("band") else "")
                     + f"(ledger #{d['ledger_seq']})")
    return lines
