"""The fleet report: ``OUT/fleet_report.html`` (and ``fleet_summary.json``), in the session report's style.

One row per session (workload, device, status, final ratio and interval, kept
changes, warm start, time used, stop reason, a link to its own report.html),
the progress across the fleet (rewritten while it runs), and what the KB
learned: each recipe the fleet's sessions were filed under, with its winner
and how many of the fleet's sessions it holds. Every number comes from a
session's own files (state.json, session_breakdown.json) or the KB row; a
session that hasn't closed shows its state, never a guessed result.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping

from inferloom.fleet.plan import FleetPlan
from inferloom.fleet.status import SessionStatus
from inferloom.kb import KBError, RecipeStore, WorkloadKey
from inferloom.redact import redact, redact_text, redact_url
from inferloom.report.fmt import changes_text, esc, number, ratio_x
from inferloom.report.html import PAGE_CSS
from inferloom.session.atomic import write_json_atomic
from inferloom.session.manifest import read_manifest

__all__ = ["summary", "learned", "render_fleet_html", "write_fleet_report"]

_EXTRA_CSS = """
.bar { height: 14px; background: var(--panel); border: 1px solid var(--line); border-radius: 7px; overflow: hidden; }
.bar > div { height: 100%; background: var(--good); }
"""


def _kept(b: Mapping[str, Any] | None) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for step in (b or {}).get("action_path") or []:
        merged.update(step.get("changes") or {})
    return merged


def _row(plan: FleetPlan, s: SessionStatus, spec: Mapping[str, Any], device: str) -> dict[str, Any]:
    t = spec.get("traffic") or {}
    b = s.breakdown or {}
    f = b.get("final") or {}
    wr = (s.state.get("extra") or {}).get("warm_replay") or {}
    d = plan.session_dir(s.name)
    return {"name": s.name, "status": s.status, "phase": s.phase, "session_id": s.session_id,
            "workload": f"{spec.get('model')} / {spec.get('framework')} ({spec.get('dtype')}); "
                        f"{t.get('concurrency')} conc, {t.get('input_len')} in / {t.get('output_len')} out",
            "device": device, "trials_used": s.trials_used, "elapsed_s": s.elapsed_s,
            "ratio": f.get("ratio") if s.status == "done" else None, "ci_low": f.get("ci_low"),
            "ci_high": f.get("ci_high"), "verdict": f.get("protocol_verdict"),
            "kept": _kept(b), "stop_reason": s.stop_reason, "error": s.error,
            "warm_start": ({"recipe_id": wr.get("recipe_id"), "adopted": wr.get("adopted"), "ratio": wr.get("ratio")}
                           if wr.get("recipe_id") is not None else {"skipped": wr.get("skipped")} if wr else None),
            "report": (f"sessions/{s.name}/report.html" if (d / "report.html").is_file() else None)}


def summary(plan: FleetPlan, statuses: list[SessionStatus], started_at: float, live: bool,
            kb_url: str | None) -> dict[str, Any]:
    """The fleet's state as one JSON-ready dict (what the page and fleet_summary.json show)."""
    rows = [_row(plan, st, p.spec, p.device) for p, st in zip(plan.sessions, statuses)]
    counts = {k: sum(r["status"] == k for r in rows) for k in ("done", "running", "pending", "failed")}
    return {"generated_at": time.time(), "started_at": started_at, "live": live, "out": str(plan.out),
            "kb": redact_url(kb_url) if kb_url else None, "sessions": rows, "counts": counts,
            "trials": {"used": sum(r["trials_used"] for r in rows), "budget": sum(p.max_trials for p in plan.sessions)},
            "minutes": {"used": sum(r["elapsed_s"] for r in rows) / 60,
                        "budget": sum(p.budget_minutes for p in plan.sessions)}}


def learned(plan: FleetPlan, statuses: list[SessionStatus], kb_url: str | None) -> list[dict[str, Any]]:
    """Each KB recipe the fleet's closed sessions were filed under (read back from the KB)."""
    if not kb_url:
        return []
    ours = {s.session_id for s in statuses if s.session_id}
    keys: dict[str, WorkloadKey] = {}
    for s in statuses:
        if s.status != "done":
            continue
        try:
            k = WorkloadKey.from_session(read_manifest(plan.session_dir(s.name)), s.state)
        except Exception:  # a damaged manifest: that session's row says so elsewhere
            continue
        keys[str(k)] = k
    out = []
    try:
        with RecipeStore(kb_url) as store:
            for k in keys.values():
                r = store.get(k)
                if r is None:
                    continue
                w = r.winner or {}
                out.append({"recipe_id": r.id, "key": str(k), "status": r.status, "winner_ratio": w.get("ratio"),
                            "winner_ci": [w.get("ci_low"), w.get("ci_high")], "winner_changes": w.get("changes"),
                            "winner_session": w.get("session_id"), "winner_from_fleet": w.get("session_id") in ours,
                            "fleet_sessions": sum(sid in ours for sid in r.session_ids),
                            "all_sessions": len(r.session_ids), "lessons": len(r.lessons), "failures": len(r.failed)})
    except KBError as exc:
        return [{"error": str(exc)}]
    return out


def _tag(status: str) -> str:
    cls = {"done": "good", "failed": "bad"}.get(status, "")
    return f'<span class="tag {cls}">{esc(status)}</span>'


def render_fleet_html(s: Mapping[str, Any], kb_rows: list[dict[str, Any]]) -> str:
    n = len(s["sessions"])
    c = s["counts"]
    frac = (c["done"] + c["failed"]) / n if n else 1.0
    head = "inferloom fleet report" + (" (live)" if s["live"] else "")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s["generated_at"]))
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             '<meta http-equiv="refresh" content="10">' if s["live"] else "",
             f"<title>{esc(head)}</title><style>{PAGE_CSS}{_EXTRA_CSS}</style></head><body><main>",
             f"<h1>{esc(head)}</h1>",
             f'<p class="sub">{n} sessions in {esc(s["out"])}; knowledge base {esc(s["kb"] or "none")}; '
             f"written {esc(when)}{' (rewritten while the fleet runs)' if s['live'] else ''}</p>",
             '<nav><a href="#progress">Progress</a><a href="#sessions">Sessions</a><a href="#kb">What the KB learned</a></nav>',
             '<section id="progress"><h2>Progress</h2><div class="headline">',
             f'<div class="big">{c["done"]}/{n} done</div>',
             f'<div class="bar"><div style="width:{100 * frac:.1f}%"></div></div><dl class="kv">',
             f"<dt>running</dt><dd>{c['running']}</dd><dt>pending</dt><dd>{c['pending']}</dd>"
             f"<dt>failed</dt><dd>{c['failed']}</dd>",
             f"<dt>trials used</dt><dd>{s['trials']['used']} of {s['trials']['budget']} budgeted</dd>",
             f"<dt>session time used</dt><dd>{number(s['minutes']['used'], ',.1f')} of "
             f"{number(s['minutes']['budget'], ',.1f')} min budgeted</dd>",
             f"<dt>wall time</dt><dd>{number((s['generated_at'] - s['started_at']) / 60, ',.1f')} min</dd></dl></div>",
             '<p class="note">From each session directory\'s state.json (phase, trials, time used).</p></section>',
             '<section id="sessions"><h2>Sessions</h2><div class="tw"><table><tr><th>session</th><th>workload</th>'
             '<th>device</th><th>status</th><th class="num">final / stock</th><th>kept changes</th>'
             '<th>warm start</th><th class="num">trials</th><th class="num">min</th><th>stop reason</th></tr>']
    for r in s["sessions"]:
        name = esc(r["name"])
        link = f'<a href="{esc(r["report"])}">{name}</a>' if r["report"] else name
        ratio = "" if r["ratio"] is None else (
            f"{ratio_x(r['ratio'])} [{ratio_x(r['ci_low'])}, {ratio_x(r['ci_high'])}] {esc(r['verdict'] or '')}")
        ws = r["warm_start"] or {}
        warm = (f"recipe #{ws['recipe_id']}: {'adopted' if ws.get('adopted') else 'not adopted'}"
                if ws.get("recipe_id") is not None else esc(ws.get("skipped") or ""))
        status = _tag(r["status"]) + (f" {esc(r['phase'])}" if r["status"] == "running" else "")
        stop = esc(r["error"] if r["status"] == "failed" else r["stop_reason"] or "")
        parts.append(f"<tr><td>{link}</td><td>{esc(r['workload'])}</td><td>{esc(r['device'])}</td><td>{status}</td>"
                     f'<td class="num">{ratio}</td><td>{esc(changes_text(r["kept"])) if r["kept"] else ""}</td>'
                     f'<td>{warm}</td><td class="num">{r["trials_used"]}</td>'
                     f'<td class="num">{r["elapsed_s"] / 60:.1f}</td><td>{stop}</td></tr>')
    parts.append('</table></div><p class="note">final / stock: the closing paired comparison of the final stack '
                 "against stock (session_breakdown.json), with its interval and verdict.</p></section>")
    parts.append('<section id="kb"><h2>What the KB learned</h2>')
    if not kb_rows:
        parts.append('<p class="absent">No recipe yet: no session of this fleet has closed into the KB.</p>')
    elif "error" in kb_rows[0]:
        parts.append(f'<p class="absent">The KB could not be read: {esc(kb_rows[0]["error"])}</p>')
    else:
        parts.append('<div class="tw"><table><tr><th>recipe</th><th>key</th><th>winner</th><th>from</th>'
                     '<th class="num">fleet sessions</th><th class="num">all sessions</th><th class="num">lessons</th>'
                     '<th class="num">failures</th></tr>')
        for k in kb_rows:
            win = ("no winner" if k["winner_ratio"] is None else
                   f"{ratio_x(k['winner_ratio'])} [{ratio_x(k['winner_ci'][0])}, {ratio_x(k['winner_ci'][1])}] "
                   f"{changes_text(k['winner_changes'] or {})}")
            src = "" if k["winner_session"] is None else (
                f"{k['winner_session']}{' (this fleet)' if k['winner_from_fleet'] else ' (earlier)'}")
            parts.append(f"<tr><td>#{k['recipe_id']} {_tag(k['status'])}</td><td><code>{esc(k['key'])}</code></td>"
                         f"<td>{esc(win)}</td><td>{esc(src)}</td><td class=\"num\">{k['fleet_sessions']}</td>"
                         f"<td class=\"num\">{k['all_sessions']}</td><td class=\"num\">{k['lessons']}</td>"
                         f"<td class=\"num\">{k['failures']}</td></tr>")
        parts.append("</table></div>")
    parts.append("</section></main></body></html>")
    return "\n".join(p for p in parts if p) + "\n"


def write_fleet_report(plan: FleetPlan, statuses: list[SessionStatus], *, started_at: float, live: bool,
                       kb_url: str | None) -> Path:
    """Write ``fleet_summary.json`` and ``fleet_report.html`` into the fleet directory, atomically."""
    s = summary(plan, statuses, started_at, live, kb_url)
    kb_rows = [] if live else learned(plan, statuses, kb_url)
    write_json_atomic(plan.out / "fleet_summary.json", redact({**s, "kb_learned": kb_rows}))
    path = plan.out / "fleet_report.html"
    tmp = path.with_name(".fleet_report.html.tmp")
    tmp.write_text(redact_text(render_fleet_html(s, kb_rows)), encoding="utf-8")
    tmp.replace(path)
    return path
