"""The sections of the HTML report (:mod:`inferloom.report.html`), each a function of the breakdown that
returns its HTML (or None: no section); the HTML building blocks they share (citations, tables, notes) are in
:mod:`inferloom.report.html_blocks`."""

from __future__ import annotations

from typing import Any

from inferloom.report.breakdown import TIME_CATEGORIES
from inferloom.report.fmt import esc, num, number, pct_safe, ratio_x, sandbox_text
from inferloom.report.html_blocks import _absent, _changes, _cite, _table
from inferloom.report.html_roofline import decode_roofline
from inferloom.report.svg import action_path_chart, profile_chart, sweep_chart

__all__ = ["section_bodies"]


def _summary(b: dict[str, Any]) -> str:
    s, f = b.get("stock") or {}, b.get("final") or {}
    out = []
    if f.get("ledger_seq") and num(f.get("ratio")) is not None:
        r = float(f["ratio"])
        cls = "good" if (num(f.get("ci_low")) or 0) > 1 else "bad" if (num(f.get("ci_high")) or 2) < 1 else ""
        q = f.get("quality_passed")
        tol = f" ({esc(f['quality_tolerance'])})" if f.get("quality_tolerance") else ""
        qtag = (f'<span class="tag good">held-out quality: pass{tol}</span>' if q else
                '<span class="tag bad">held-out quality: FAIL</span>' if q is False else
                '<span class="tag">held-out quality: not evaluated</span>')
        out.append(f'<div class="headline"><div>Final stack vs stock (paired, the headline)</div>'
                   f'<div class="big {cls}">{ratio_x(r)} ({pct_safe(r)})</div>'
                   f"<div>interval [{pct_safe(f.get('ci_low'))}, {pct_safe(f.get('ci_high'))}] over {esc(f.get('n_pairs'))} pairs, "
                   f"protocol {esc(f.get('protocol_verdict'))}; {number(f.get('objective_median'))} vs "
                   f"{number(f.get('stock_median_same_run'))} {esc(b.get('objective_label') or 'output tok/s')} "
                   f"{_cite(f['ledger_seq'])} {qtag}</div></div>")
        if f.get("quality_failed"):
            out.append(f"<p>Quality checks failed: {esc(', '.join(map(str, f['quality_failed'])))} {_cite(f['ledger_seq'])}</p>")
    elif b.get("stock_never_ran"):
        nv = b["stock_never_ran"]
        out.append(f'<div class="headline"><div>Stock never ran: nothing was measured (the session exits 1)</div>'
                   f'<div class="big bad">no baseline</div><div>{esc(nv.get("why"))} {_cite(nv.get("ledger_seq"))}</div></div>')
    else:
        out.append(f'<div class="headline"><div>Final stack vs stock</div><div class="big">{ratio_x(f.get("ratio", 1.0))}</div>'
                   f"<div>{esc(f.get('note') or 'nothing was kept: the final stack is stock')} "
                   f"{_cite(b.get('close_ledger_seq'))}</div></div>")
    rows = []
    if s:
        rows.append(("Stock", f"{number(s.get('objective_median'))} {esc(b.get('objective_label') or 'output tok/s')} "
                              f"(median of the A/A runs) {_cite(s.get('ledger_seq'))}"))
        nz = s.get("noise") or {}
        if nz:
            floor = num(nz.get("ratio"))
            rows.append(("A/A noise floor",
                         f"stock against a second stock instance: ratio {number(nz.get('ratio'), '.4f')} "
                         f"[{number(nz.get('ci_low'), '.4f')}, {number(nz.get('ci_high'), '.4f')}] over {esc(nz.get('n_pairs'))} pairs; "
                         f"a keep's lower bound must clear {number(abs(floor - 1) * 100 if floor is not None else None, '.2f')}% "
                         f"as well as the minimum gain {_cite(s.get('ledger_seq'))}"))
    rows.append(("Stop reason", f"{esc(b.get('stop_reason'))} {_cite(b.get('close_ledger_seq'))}"))
    rows.append(("Kept without a quality verdict", f"{esc(b.get('unscored_keep_count', 0))} "
                 f"{_cite([a.get('ledger_seq') for a in b.get('action_path', []) if a.get('quality_passed') is None] or b.get('close_ledger_seq'))}"))
    kf = b.get("kb_write_failed")
    if kf:
        rows.append(("Knowledge base", f"<strong>not filed</strong>: {esc(kf.get('error'))}; {esc(kf.get('todo'))} "
                                       f"{_cite(kf.get('ledger_seq'))}"))
    wr = b.get("warm_replay")
    if wr:
        if wr.get("chosen") is None:
            txt = "no recipe above the confidence threshold: started from stock"
        else:
            txt = (f"recipe {esc(wr.get('chosen'))} (confidence {number(wr.get('confidence'), '.2f')}); "
                   + (f"replayed, verdicts {_cite(wr.get('replayed'))}" if wr.get("replayed") else "not adopted"))
        rows.append(("Warm replay (knowledge base)", f"{txt} {_cite(wr.get('ledger_seq'))}"))
    rf = (b.get("roofline") or {})
    if (rf.get("stock") or {}).get("fraction") is not None:
        st_ = rf["stock"]
        img = b.get("objective_label") == "images/s"
        ceil_txt = number(st_.get("ceiling_tok_per_s"), ",.4g" if img else ",.0f") + (" images/s" if img else " tok/s")
        rows.append(("Roofline", f"stock at {st_['fraction'] * 100:.1f}% of the {ceil_txt} "
                     f"ceiling, headroom {ratio_x(st_.get('headroom'), 2)} {_cite((rf.get('ledger_seqs') or [None])[0])}"))
    out.append('<dl class="kv">' + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>")
    sc, fc = b.get("stock_config") or {}, b.get("final_config") or {}
    if sc or fc:
        keys = list(dict.fromkeys(list(sc) + list(fc)))
        changed = ["changed" if sc.get(k) != fc.get(k) else "" for k in keys]
        out.append(f"<h3>Configuration: stock and final {_cite(b.get('close_ledger_seq'))}</h3>")
        out.append(_table([("knob", False), ("stock", False), ("final", False)],
                          [[f"<code>{esc(k)}</code>", esc(sc.get(k)), esc(fc.get(k))] for k in keys], changed))
    return "".join(out)


def _action_path(b: dict[str, Any]) -> str:
    path = b.get("action_path") or []
    final = b.get("final") or {}
    if not path:
        return _absent("Nothing was kept: every candidate was rejected or refused (see below), so the final stack is stock "
                       f"and there is no path to draw {_cite(b.get('close_ledger_seq'))}.")
    out = []
    drawable = [a for a in path if num(a.get("ratio")) is not None]
    if len(drawable) == len(path):
        out.append("<figure>" + action_path_chart(path, final) + "<figcaption>Each step is one kept change, measured paired "
                   "against the stack before it; the line multiplies the steps' ratios (whiskers: each step's interval, scaled "
                   "by the cumulative ratio before it). The dashed line and band are the final stack measured against stock "
                   "directly: that is the headline, the product is only the path to it.</figcaption></figure>")
    else:
        out.append(_absent("The step chart needs a ratio for every kept step; some lack one (see the table)."))
    rows, c = [], 1.0
    for a in path:
        r = num(a.get("ratio"))
        c = c * r if r is not None else c
        q = a.get("quality_passed")
        rows.append([esc(a.get("trial")), esc(a.get("cycle")), _changes(a.get("changes")), pct_safe(r),
                     f"[{pct_safe(a.get('ci_low'))}, {pct_safe(a.get('ci_high'))}]", ratio_x(c),
                     ("pass" if q else "FAIL" if q is False else "unscored")
                     + (f" ({esc(a['quality_tolerance'])})" if q and a.get("quality_tolerance") else ""),
                     _cite(a.get("ledger_seq"))])
    out.append(_table([("trial", True), ("cycle", True), ("change", False), ("gain vs the stack before", True),
                       ("interval", True), ("cumulative", True), ("quality", False), ("ledger", False)], rows))
    return "".join(out)


def _rejected(b: dict[str, Any]) -> str:
    rej, refs = b.get("rejected") or [], b.get("refusals") or []
    out = []
    if rej:
        out.append(_table([("trial", True), ("change", False), ("outcome", False), ("gain", True), ("interval", True),
                           ("why", False), ("ledger", False)],
                          [[esc(r.get("trial")), _changes(r.get("changes")), f'<span class="tag">{esc(r.get("outcome"))}</span>',
                            pct_safe(r.get("ratio")), f"[{pct_safe(r.get('ci_low'))}, {pct_safe(r.get('ci_high'))}]", esc(r.get("lesson")),
                            _cite(r.get("ledger_seq"))] for r in rej]))
    else:
        out.append(_absent("No measured candidate was rejected: every trial was kept."))
    out.append("<h3>Refused before measurement</h3>")
    if refs:
        out.append(_table([("rule", False), ("agent", False), ("why", False), ("ledger", False)],
                          [[f"<code>{esc(r.get('rule'))}</code>", esc(r.get("agent")), esc(r.get("why")), _cite(r.get("ledger_seq"))]
                           for r in refs]))
    else:
        out.append('<p class="note">No proposal was refused by a rule.</p>')
    return "".join(out)


def _patches(b: dict[str, Any]) -> str | None:
    """Source patches and the rollback drill of a custom workload; None (no
    section) for other sessions."""
    if "patches" not in b and "rollback_drill" not in b:
        return None
    out = []
    if b.get("objective_unit") is not None:
        out.append(f'<p class="note">Objective unit (from the entrypoint\'s results): '
                   f"{esc(b['objective_unit'] or '(none given)')}</p>")
    if b.get("sandbox"):
        head, detail = sandbox_text(b["sandbox"])
        out.append(f"<p><strong>{esc(head)}</strong>: {esc(detail)} {_cite(b['sandbox'].get('ledger_seq'))}</p>")
    rows = []
    for p in b.get("patches") or []:
        if p.get("kept"):
            where = (f'overlay <code>{esc(str((p.get("overlay") or {}).get("digest"))[:12])}</code>' if p.get("engine")
                     else f'commit <code>{esc(str(p.get("commit"))[:10])}</code>')
            what = f'<span class="tag good">kept</span> {where}'
        elif p.get("gate") == "measure":
            what = (f'<span class="tag bad">rejected after measurement</span> '
                    f"<code>{esc(p.get('rule') or p.get('outcome'))}</code>")
        else:
            what = f'<span class="tag">refused at gate {esc(p.get("gate"))}</span> <code>{esc(p.get("rule"))}</code>'
        measured = p.get("gate") == "measure" or p.get("kept")
        why = "; ".join(p.get("quality_failed") or []) or p.get("why") or p.get("outcome") or ""
        rows.append([f"<code>{esc(p.get('id'))}</code>", esc(p.get("title")), what,
                     pct_safe(p.get("ratio")) if measured else "",
                     f"[{pct_safe(p.get('ci_low'))}, {pct_safe(p.get('ci_high'))}]" if measured else "",
                     esc(why), _cite(p.get("ledger_seq"))])
    if rows:
        out.append(_table([("patch", False), ("hypothesis", False), ("outcome", False), ("gain", True),
                           ("interval", True), ("why", False), ("ledger", False)], rows))
    else:
        out.append(_absent("No patch was proposed."))
    d = b.get("rollback_drill")
    if d:
        band = f", stock's own band [{pct_safe(d['band'][0])}, {pct_safe(d['band'][1])}]" if d.get("band") else ""
        out.append(f"<p>Rollback drill: <strong>{'passed' if d.get('passed') else 'FAILED'}</strong>: {esc(d.get('why'))}; "
                   + (f"dropped {esc(', '.join(d.get('reverted') or []))} (a stock start without the overlay), "
                      f"installed files unchanged: {esc(d.get('tree_identical'))}" if d.get("engine_patch") else
                      f"reverted {len(d.get('reverted') or [])} commit(s), tree identical to stock: "
                      f"{esc(d.get('tree_identical'))}")
                   + f", rolled-back vs stock {pct_safe(d.get('ratio'))} "
                   f"[{pct_safe(d.get('ci_low'))}, {pct_safe(d.get('ci_high'))}]{esc(band)} {_cite(d.get('ledger_seq'))}</p>")
    return "".join(out)


def _profile(b: dict[str, Any]) -> str:
    pr = b.get("profile")
    if not pr:
        return _absent("The ledger has no profile entry: this session ran no profiler. The synthetic adapter runs no "
                       "operators, so PRELUDE skips profiling for it (sessions from before profiling existed have none either).")
    if pr.get("skipped"):
        return _absent(f"No profile of stock: {esc(pr['skipped'])} {_cite(pr.get('ledger_seq'))}.")
    if pr.get("error") or not pr.get("categories"):
        why = f"the profiler failed: {esc(pr.get('error'))}" if pr.get("error") else "the profile recorded no categories"
        return _absent(f"No breakdown: {why} {_cite(pr.get('ledger_seq'))}.")
    cats = sorted(((c.get("label") or name, num(c.get("share")) or 0.0, num(c.get("seconds")) or 0.0)
                   for name, c in pr["categories"].items()), key=lambda t: -t[1])
    out = [f"<p>One untimed stock run under torch.profiler, wall {number(pr.get('wall_s'), '.3f')} s {_cite(pr.get('ledger_seq'))}. "
           "Shares are of the profiled wall time (profiling inflates absolute seconds; the shares are what it is for). "
           "Grey: host idle / launch gaps, the time no operator was running.</p>",
           "<figure>" + profile_chart(cats) + f"<figcaption>Category shares {_cite(pr.get('ledger_seq'))}.</figcaption></figure>"]
    ops = pr.get("top_ops") or []
    if ops:
        out.append(f"<h3>Top operators {_cite(pr.get('ledger_seq'))}</h3>")
        out.append(_table([("operator", False), ("category", False), ("share", True), ("seconds", True), ("calls", True)],
                          [[f"<code>{esc(o.get('name'))}</code>", esc(o.get("category")), f"{(num(o.get('share')) or 0) * 100:.1f}%",
                            number(o.get("seconds"), ".4f"), esc(o.get("count"))] for o in ops]))
    return "".join(out)


def _sweep(b: dict[str, Any]) -> str:
    pts = b.get("sweep") or []
    if not pts:
        if not (b.get("final") or {}).get("ledger_seq"):
            return _absent("No sweep: nothing was kept, so there is no final stack to sweep against stock.")
        phases = b.get("phases") or []
        reasons = []
        for i, ph in enumerate(phases):
            if ph.get("to") == "SWEEP" and i + 1 < len(phases) and phases[i + 1].get("from") is None:
                reasons.append(f"{esc(phases[i + 1].get('why'))} {_cite(phases[i + 1].get('ledger_seq'))}")
        why = "; ".join(reasons) if reasons else "SWEEP did not run (disabled with --no-sweep, or the budget ran out)"
        return _absent(f"No sweep measurement in the ledger: {why}.")
    ok = [p for p in pts if num(p.get("ratio")) is not None and p.get("point")]
    latest: dict[tuple, dict[str, Any]] = {}
    for p in ok:  # the final stack's sweep is the last cycle's
        k = tuple(p["point"])
        if k not in latest or (p.get("cycle") or 0) >= (latest[k].get("cycle") or 0):
            latest[k] = p
    out = []
    if latest:
        cycles = sorted({p.get("cycle") for p in latest.values()}, key=lambda c: c or 0)
        failed = [p for p in pts if num(p.get("ratio")) is None and p.get("point") and tuple(p["point"]) not in latest]
        out.append("<figure>" + sweep_chart(list(latest.values()), failed) + "<figcaption>Throughput of the final stack "
                   "over stock at each operating point (paired, a fixed number of pairs per point: descriptive, not a keep "
                   "decision); whiskers are the intervals, the dashed line is parity"
                   + (", a cross on the axis is a point that failed" if failed else "") + f". Cycle {', '.join(map(str, cycles))}. "
                   f"{_cite([p['ledger_seq'] for p in sorted(latest.values(), key=lambda p: p['ledger_seq'])])}</figcaption></figure>")
    else:
        out.append(_absent("Every sweep point failed: nothing to plot (see the table)."))
    rows = [[esc(p.get("cycle")), esc((p.get("point") or [None, None])[0]), esc((p.get("point") or [None, None])[1]),
             ratio_x(p.get("ratio")) if num(p.get("ratio")) is not None else "failed",
             f"[{number(p.get('ci_low'), '.3f')}, {number(p.get('ci_high'), '.3f')}]" if num(p.get("ratio")) is not None else "",
             _cite(p.get("ledger_seq"))] for p in pts]
    out.append(_table([("cycle", True), ("concurrency", True), ("input len", True), ("ratio", True), ("interval", True),
                       ("ledger", False)], rows))
    return "".join(out)


def _time(b: dict[str, Any]) -> str:
    t = b.get("time_s") or {}
    if not t:
        return _absent("No timing in the breakdown.")
    total = num(t.get("total")) or 0.0
    vals = {k: num(t.get(k)) or 0.0 for k in TIME_CATEGORIES if k in t or k != "server_startup"}
    rows = [[esc(k.replace("_", " ")), f"{v:.1f}", f"{v / total * 100:.0f}%" if total > 0 and k != "total" else ""]
            for k, v in vals.items()]
    servers = (f"<p>{sv['starts']} server starts ({sv['restarts']} restarts, {sv['failed']} failed; compile cache warm "
               f"{sv['compile_cache_warm']}, cold {sv['compile_cache_cold']}), one ledger entry each.</p>"
               ) if (sv := b.get("servers") or {}) else ""
    return (f"<p>Total from the close entry {_cite(b.get('close_ledger_seq'))}; the parts are sums over the measurement "
            "entries' timings" + (" (server start-up: over the server start entries)" if "server_startup" in t else "")
            + ", the harness is the rest.</p>"
            + _table([("", False), ("seconds", True), ("share", True)], rows) + servers)


def _predicted(b: dict[str, Any]) -> str:
    pm = b.get("predicted_vs_measured") or []
    if not pm:
        return _absent("No trial was measured.")
    rows = []
    for p in pm:
        pg = num(p.get("predicted_gain"))
        rows.append([esc(p.get("trial")), _changes(p.get("changes")), "n/a" if pg is None else f"{pg * 100:+.0f}%",
                     pct_safe(p.get("measured_ratio")), _cite(p.get("ledger_seq"))])
    return _table([("trial", True), ("change", False), ("predicted", True), ("measured", True), ("ledger", False)], rows)


def _phases(b: dict[str, Any]) -> str:
    ph = b.get("phases") or []
    if not ph:
        return _absent("No phase transition in the ledger.")
    return _table([("from", False), ("to", False), ("why", False), ("ledger", False)],
                  [[esc(p.get("from") or "—"), esc(p.get("to") or "(skip)"), esc(p.get("why")), _cite(p.get("ledger_seq"))]
                   for p in ph])


def section_bodies(b: dict[str, Any]) -> dict[str, str | None]:
    """Each section's HTML by section id (the keys of
    :data:`inferloom.report.html.SECTIONS`); None: the section is left out."""
    return {
        "summary": _summary(b),
        "action-path": _action_path(b),
        "rejected": _rejected(b),
        "patches": _patches(b),
        "profile": _profile(b),
        "roofline": decode_roofline(b),
        "sweep": _sweep(b),
        "time": _time(b),
        "predicted": _predicted(b),
        "phases": _phases(b),
    }
