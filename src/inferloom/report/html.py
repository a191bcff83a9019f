"""``inferloom report DIR --html``: one self-contained HTML page per session.

The page is a pure function of the session breakdown
(:func:`inferloom.report.breakdown.breakdown_from_ledger`), like ``report.md``:
every number on it cites the ledger entry it comes from (``ledger #N``).
Self-contained: CSS in one ``<style>`` block, charts as inline SVG drawn here
in Python; no JavaScript, no external URL, no image file.

Sections (:data:`SECTIONS`): summary, action path (a step chart of the
cumulative gain), rejected candidates and why, source patches, deploy (the final
stack as a user runs it: :mod:`inferloom.report.deploy`), profile breakdown (horizontal
bars of category shares), roofline (log-log: attainable FLOP/s against
arithmetic intensity, the measured memory-bandwidth slope and matmul roof,
the stock and final decode steps placed on it), sweep (ratio final / stock
against concurrency, one line per input length, interval whiskers, a
reference line at 1.0), then where the time went, predicted against
measured, the platform (the PRELUDE and CLOSE audits, a change between them
flagged), energy per output token (or why it was not measured), the LLM agents (only with agents.llm: calls, tokens, cost, cost per
kept gain, refusals by rule) and the phase log. A section without data says why it is absent.
"""

from __future__ import annotations

from typing import Any

from inferloom.report.deploy import deploy_html
from inferloom.report.fmt import esc
from inferloom.report.html_image import image_roofline_body, is_image_roofline
from inferloom.report.html_llm import llm_section
from inferloom.report.html_platform import energy_section, platform_section
from inferloom.report.html_sections import section_bodies

__all__ = ["SECTIONS", "PAGE_CSS", "render_html"]


# id -> heading, in page order.
SECTIONS: dict[str, str] = {
    "summary": "Summary",
    "action-path": "Action path",
    "rejected": "Rejected candidates and why",
    "patches": "Source patches (custom workload)",
    "deploy": "Deploy",
    "profile": "Profile breakdown",
    "roofline": "Roofline",
    "sweep": "Sweep: final stack vs stock",
    "time": "Where the time went",
    "predicted": "Predicted vs measured",
    "platform": "Platform",
    "energy": "Energy per output (token or image)",
    "llm": "LLM agents",
    "phases": "Phases",
}

_CSS = """
:root { --fg:#1d1f23; --muted:#5f6670; --line:#d9dde3; --bg:#ffffff; --panel:#f6f7f9; --good:#0a7a3b; --bad:#b3261e; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--fg); font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif; }
main { max-width: 1000px; margin: 0 auto; padding: 24px 28px 64px; }
h1 { font-size: 26px; margin: 8px 0 2px; }
h2 { font-size: 20px; margin: 40px 0 10px; padding-bottom: 4px; border-bottom: 2px solid var(--line); }
h3 { font-size: 15px; margin: 18px 0 6px; }
p { margin: 6px 0; }
.sub { color: var(--muted); margin: 0 0 12px; }
nav { font-size: 13px; margin: 10px 0 4px; }
nav a { color: var(--muted); margin-right: 12px; text-decoration: none; }
nav a:hover { text-decoration: underline; }
.cite { color: var(--muted); font-size: 12px; white-space: nowrap; font-variant-numeric: tabular-nums; }
.headline { background: var(--panel); border: 1px solid var(--line); border-radius: 8px; padding: 14px 18px; margin: 10px 0 14px; }
.headline .big { font-size: 30px; font-weight: 650; font-variant-numeric: tabular-nums; }
.headline .big.good { color: var(--good); } .headline .big.bad { color: var(--bad); }
.kv { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 6px 0; }
.kv dt { color: var(--muted); } .kv dd { margin: 0; }
.tw { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; margin: 8px 0 4px; font-size: 13.5px; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: var(--panel); font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.num { white-space: nowrap; }
tr.changed td { background: #fff6dc; }
code { overflow-wrap: anywhere; font: 12.5px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace; background: var(--panel); padding: 0 3px; border-radius: 3px; }
.absent { color: var(--muted); background: var(--panel); border-left: 4px solid var(--line); padding: 8px 12px; }
.note { color: var(--muted); font-size: 13px; }
.tag { display: inline-block; font-size: 12px; padding: 0 6px; border-radius: 10px; background: var(--panel); border: 1px solid var(--line); }
.tag.bad { color: var(--bad); border-color: #e6b3ae; background: #fdf0ef; }
.tag.good { color: var(--good); border-color: #a9d8bb; background: #eef8f2; }
figure { margin: 10px 0 6px; }
figcaption { color: var(--muted); font-size: 13px; margin-top: 2px; }
svg.chart { width: 100%; height: auto; max-width: 860px; display: block; }
svg.chart text { font-family: system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif; font-size: 12px; fill: #1d1f23; }
svg.chart .axis { stroke: #8a9099; stroke-width: 1; }
svg.chart .grid { stroke: #e6e8ec; stroke-width: 1; }
svg.chart .tick { fill: #5f6670; font-size: 11px; }
svg.chart .ref { stroke: #8a9099; stroke-width: 1.2; stroke-dasharray: 5 4; }
svg.chart .lbl { font-size: 12px; }
svg.chart .small { font-size: 11px; fill: #5f6670; }
svg.chart .lbl, svg.chart .small { paint-order: stroke; stroke: #ffffff; stroke-width: 3px; stroke-linejoin: round; }
"""

PAGE_CSS = _CSS  # the one page style: the fleet report (inferloom.fleet.report) uses it too


def render_html(b: dict[str, Any], *, manifest: dict[str, Any] | None = None, title: str | None = None,
                deploy: dict[str, Any] | None = None) -> str:
    """The whole page, from a breakdown dict. ``manifest`` (optional) names
    the workload in the page header (model, framework, device, traffic); ``deploy`` (optional): the
    Deploy section (:func:`inferloom.report.deploy.session_deploy`)."""
    spec = (manifest or {}).get("spec") or {}
    head = title or ("inferloom session report: stock never ran" if b.get("stock_never_ran") else "inferloom session report")
    sub = ""
    if spec:
        t = spec.get("traffic") or {}
        sub = (f"{spec.get('model')} on {spec.get('framework')} / {spec.get('device')} ({spec.get('dtype')}); "
               + (f"traffic: trace {t['trace']} at x{t.get('trace_speed', 1.0):g} " if t.get("trace") else
                  f"traffic {t.get('concurrency')} concurrent, {t.get('input_len')} in / {t.get('output_len')} out ")
               + f"(spec, manifest.json); session {(manifest or {}).get('seeds', {}).get('session_id', '')}")
    body = {**section_bodies(b), "llm": llm_section(b),
            "platform": platform_section(b), "energy": energy_section(b), "deploy": None if b.get("stock_never_ran") else deploy_html(deploy)}
    if is_image_roofline(b):  # per denoising step, images/s
        body["roofline"] = image_roofline_body(b)
    shown = {k: v for k, v in SECTIONS.items() if body[k] is not None}
    if "patches" in shown and any(p.get("engine") for p in b.get("patches") or []):  # as report.md says it
        shown["patches"] = "Engine source patches (serving.engine_patches)"
    nav = "".join(f'<a href="#{k}">{esc(v)}</a>' for k, v in shown.items())
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{esc(head)}</title><style>{_CSS}</style></head><body><main>",
             f"<h1>{esc(head)}</h1>", f'<p class="sub">{esc(sub)}</p>' if sub else "",
             '<p class="note">Every number cites the ledger entry it comes from (ledger #N: the seq in ledger.jsonl); '
             "the page is re-rendered from the ledger alone.</p>", f"<nav>{nav}</nav>"]
    for k, v in shown.items():
        parts.append(f'<section id="{k}"><h2>{esc(v)}</h2>{body[k]}</section>')
    parts.append("</main></body></html>")
    return "\n".join(p for p in parts if p) + "\n"
