"""``inferloom report DIR --html``: one self-contained HTML page per session.

The page is a pure function of the session breakdown
(:func:`inferloom.session.close.breakdown_from_ledger`), like ``report.md``:
every number on it cites the ledger entry it comes from (``ledger #N``).
Self-contained: CSS in one ``<style>`` block, charts as inline SVG drawn here
in Python; no JavaScript, no external URL, no image file.

Sections (:data:`SECTIONS`): summary, action path (a step chart of the
cumulative gain), rejected candidates and why, profile breakdown (horizontal
bars of category shares), roofline (log-log: attainable FLOP/s against
arithmetic intensity, the measured memory-bandwidth slope and matmul roof,
the stock and final decode steps placed on it), sweep (ratio final / stock
against concurrency, one line per input length, interval whiskers, a
reference line at 1.0), then where the time went, predicted against
measured, and the phase log. A section without data says why it is absent.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any, Iterable, Sequence

__all__ = ["SECTIONS", "render_html", "write_html"]

# id -> heading, in page order.
SECTIONS: dict[str, str] = {
    "summary": "Summary",
    "action-path": "Action path",
    "rejected": "Rejected candidates and why",
    "patches": "Source patches (custom workload)",
    "profile": "Profile breakdown",
    "roofline": "Roofline",
    "sweep": "Sweep: final stack vs stock",
    "time": "Where the time went",
    "predicted": "Predicted vs measured",
    "phases": "Phases",
}

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
STOCK_COLOR = "#6b6b6b"
FINAL_COLOR = "#0072B2"

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


# ------------------------------------------------------------------ helpers
def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def _cite(seq: Any) -> str:
    if isinstance(seq, (list, tuple)):
        seqs = [s for s in seq if s is not None]
        if not seqs:
            return '<span class="cite">(ledger: none)</span>'
        return f'<span class="cite">(ledger {", ".join("#" + _e(s) for s in seqs)})</span>'
    if seq is None:
        return '<span class="cite">(ledger: none)</span>'
    return f'<span class="cite">(ledger #{_e(seq)})</span>'


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _pct(r: Any) -> str:
    v = _num(r)
    return "n/a" if v is None else f"{(v - 1) * 100:+.1f}%"


def _x(r: Any, digits: int = 3) -> str:
    v = _num(r)
    return "n/a" if v is None else f"x{v:.{digits}f}"


def _f(x: Any, fmt: str = ",.1f", none: str = "n/a") -> str:
    v = _num(x)
    return none if v is None else format(v, fmt)


def _changes(changes: Any) -> str:
    if not isinstance(changes, dict) or not changes:
        return "<code>(none)</code>"
    return "<code>" + _e(", ".join(f"{k}={v}" for k, v in changes.items())) + "</code>"


def _si(x: float, unit: str = "", digits: int = 3) -> str:
    """1.5e12 -> '1.5 T' + unit."""
    if x == 0:
        return f"0 {unit}".strip()
    for exp, p in ((15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k"), (0, "")):
        if abs(x) >= 10**exp:
            return f"{x / 10**exp:.{digits}g} {p}{unit}".strip()
    return f"{x:.{digits}g} {unit}".strip()


def _absent(why: str) -> str:
    return f'<p class="absent">{why}</p>'


def _table(head: Sequence[tuple[str, bool]], rows: Iterable[Sequence[str]], row_class: Sequence[str] | None = None) -> str:
    """``head``: (label, numeric); cells are already-escaped HTML."""
    h = "".join(f'<th class="num">{_e(t)}</th>' if n else f"<th>{_e(t)}</th>" for t, n in head)
    out = [f'<div class="tw"><table><thead><tr>{h}</tr></thead><tbody>']
    for i, r in enumerate(rows):
        cls = f' class="{row_class[i]}"' if row_class and row_class[i] else ""
        cells = "".join(f'<td class="num">{c}</td>' if head[j][1] else f"<td>{c}</td>" for j, c in enumerate(r))
        out.append(f"<tr{cls}>{cells}</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


# --------------------------------------------------------------- SVG bits
def _nice_step(span: float, n: int) -> float:
    raw = span / max(1, n)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _lin_ticks(lo: float, hi: float, n: int = 5) -> tuple[float, float, list[float]]:
    if hi - lo < 1e-9:
        lo, hi = lo - 0.05, hi + 0.05
    step = _nice_step(hi - lo, n)
    a = math.floor(lo / step) * step
    b = math.ceil(hi / step) * step
    ticks, t = [], a
    while t <= b + step * 1e-6:
        ticks.append(round(t, 10))
        t += step
    return a, b, ticks


def _tick_label(t: float) -> str:
    s = f"{t:.3f}".rstrip("0").rstrip(".")
    return s if s not in ("-0", "") else "0"


def _svg_open(w: int, h: int, label: str) -> str:
    return (f'<svg class="chart" viewBox="0 0 {w} {h}" '
            f'role="img" aria-label="{_e(label)}"><title>{_e(label)}</title>')


def _ratio_axes(ticks: list[float], Y: Any, L: float, T: float, pw: float, ph: float) -> list[str]:
    """Horizontal grid lines with their labels, and the two axes, of a ratio chart."""
    out = []
    for t in ticks:
        out.append(_line(L, Y(t), L + pw, Y(t), "grid"))
        out.append(_text(L - 8, Y(t) + 4, _tick_label(t), "end", "tick"))
    out.append(_line(L, T, L, T + ph, "axis") + _line(L, T + ph, L + pw, T + ph, "axis"))
    return out


def _text(x: float, y: float, s: str, anchor: str = "start", cls: str = "lbl", extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" class="{cls}"{extra}>{_e(s)}</text>'


def _line(x1: float, y1: float, x2: float, y2: float, cls: str = "", style: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    s = f' style="{style}"' if style else ""
    return f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}"{c}{s}/>'


def _marker(x: float, y: float, color: str, shape: str = "circle", r: float = 5, tip: str = "", hollow: bool = False) -> str:
    fill = "#ffffff" if hollow else color
    t = f"<title>{_e(tip)}</title>" if tip else ""
    if shape == "diamond":
        pts = f"{x:.1f},{y - r * 1.3:.1f} {x + r * 1.3:.1f},{y:.1f} {x:.1f},{y + r * 1.3:.1f} {x - r * 1.3:.1f},{y:.1f}"
        return f'<polygon points="{pts}" fill="{fill}" stroke="{color}" stroke-width="1.8">{t}</polygon>'
    if shape == "square":
        return (f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r:.1f}" height="{2 * r:.1f}" fill="{fill}" '
                f'stroke="{color}" stroke-width="1.8">{t}</rect>')
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="{fill}" stroke="{color}" stroke-width="1.8">{t}</circle>'


def _whisker(x: float, y_lo: float, y_hi: float, color: str, cap: float = 5) -> str:
    return (f'<g stroke="{color}" stroke-width="1.6">'
            + _line(x, y_lo, x, y_hi) + _line(x - cap, y_lo, x + cap, y_lo) + _line(x - cap, y_hi, x + cap, y_hi)
            + "</g>")


# ------------------------------------------------------------------ charts
def sweep_chart(points: list[dict[str, Any]], failed: Sequence[dict[str, Any]] = ()) -> str:
    """Ratio (final / stock) against concurrency, a line per input length,
    interval whiskers, a dashed reference at 1.0. ``points``: breakdown sweep
    entries with a ratio (one per operating point); ``failed``: points without
    one, marked with a cross on the axis."""
    failed = [p for p in failed if p.get("point")]
    conc = sorted({int(p["point"][0]) for p in list(points) + failed})
    lens = sorted({int(p["point"][1]) for p in list(points) + failed})
    vals = [1.0] + [v for p in points for v in (_num(p.get("ci_low")), _num(p.get("ci_high")), _num(p["ratio"])) if v is not None]
    lo, hi, ticks = _lin_ticks(min(vals), max(vals), 6)
    W, H, L, R, T, B = 760, 360, 64, 150, 20, 50
    pw, ph = W - L - R, H - T - B
    band = pw / len(conc)

    def X(c: int, i: int) -> float:
        n = len(lens)
        dodge = min(14.0, band / (n + 2))
        return L + band * (conc.index(c) + 0.5) + (i - (n - 1) / 2) * dodge

    def Y(v: float) -> float:
        return T + ph * (1 - (v - lo) / (hi - lo))

    out = [_svg_open(W, H, "Sweep: throughput ratio of the final stack over stock by concurrency and input length")]
    out += _ratio_axes(ticks, Y, L, T, pw, ph)
    for c in conc:
        out.append(_text(L + band * (conc.index(c) + 0.5), T + ph + 18, str(c), "middle", "tick"))
    out.append(_text(L + pw / 2, H - 8, "concurrency (sequences in flight)", "middle"))
    out.append(_text(16, T + ph / 2, "ratio final / stock", "middle", extra=f' transform="rotate(-90 16 {T + ph / 2:.1f})"'))
    out.append(_line(L, Y(1.0), L + pw, Y(1.0), "ref"))
    out.append(_text(L + 4, Y(1.0) - 5, "stock = 1.0", "start", "small"))
    for i, ln in enumerate(lens):
        color = PALETTE[i % len(PALETTE)]
        series = sorted((p for p in points if int(p["point"][1]) == ln), key=lambda p: int(p["point"][0]))
        xy = [(X(int(p["point"][0]), i), Y(float(p["ratio"]))) for p in series]
        if len(xy) > 1:
            d = " ".join(f"{'M' if j == 0 else 'L'}{x:.1f},{y:.1f}" for j, (x, y) in enumerate(xy))
            out.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="2"/>')
        for p, (x, y) in zip(series, xy):
            cl, ch = _num(p.get("ci_low")), _num(p.get("ci_high"))
            if cl is not None and ch is not None:
                out.append(_whisker(x, Y(cl), Y(ch), color))
            tip = (f"concurrency {p['point'][0]}, input {p['point'][1]}: {_x(p['ratio'])} "
                   f"[{_f(cl, '.3f')}, {_f(ch, '.3f')}] (ledger #{p.get('ledger_seq')})")
            out.append(_marker(x, y, color, "circle", 4.5, tip))
        for p in (q for q in failed if int(q["point"][1]) == ln):
            x, y = X(int(p["point"][0]), i), T + ph - 8
            out.append(f'<g stroke="{color}" stroke-width="2.2">{_line(x - 5, y - 5, x + 5, y + 5)}{_line(x - 5, y + 5, x + 5, y - 5)}'
                       f"<title>concurrency {_e(p['point'][0])}, input {_e(p['point'][1])}: failed "
                       f"(ledger #{_e(p.get('ledger_seq'))})</title></g>")
        ly = T + 14 + i * 20
        out.append(_line(L + pw + 16, ly - 4, L + pw + 40, ly - 4, style=f"stroke:{color};stroke-width:2"))
        out.append(_marker(L + pw + 28, ly - 4, color, "circle", 3.5))
        out.append(_text(L + pw + 46, ly, f"input len {ln}"))
    out.append("</svg>")
    return "".join(out)


def roofline_chart(ceilings: dict[str, Any], pts: list[dict[str, Any]]) -> str:
    """Log-log roofline: attainable FLOP/s = min(bandwidth x intensity, matmul
    rate); ``pts``: {label, ai, achieved, attainable, color, shape, tip}."""
    bw = float(ceilings["memory_bandwidth_bytes_per_s"])
    peak = float(ceilings["matmul_flops_per_s"])
    ridge = peak / bw
    ais = [p["ai"] for p in pts] + [ridge]
    ys = [p["achieved"] for p in pts] + [peak]
    x0 = math.floor(math.log10(min(ais) / 3))
    x1 = math.ceil(math.log10(max(ais) * 3))
    y1 = math.ceil(math.log10(peak * 2))
    y0 = min(math.floor(math.log10(min(ys) / 2)), math.floor(math.log10(bw * 10**x0)))
    y0 = max(y0, y1 - 6)
    W, H, L, R, T, B = 760, 400, 78, 24, 20, 50
    pw, ph = W - L - R, H - T - B

    def X(v: float) -> float:
        return L + pw * (math.log10(v) - x0) / (x1 - x0)

    def Y(v: float) -> float:
        v = max(v, 10**y0)
        return T + ph * (1 - (math.log10(v) - y0) / (y1 - y0))

    out = [_svg_open(W, H, "Roofline: attainable FLOP/s against arithmetic intensity, with the stock and final decode steps")]
    for k in range(x0, x1 + 1):
        out.append(_line(X(10**k), T, X(10**k), T + ph, "grid"))
        out.append(_text(X(10**k), T + ph + 18, _tick_label(10**k) if -3 <= k <= 4 else f"1e{k}", "middle", "tick"))
    for k in range(y0, y1 + 1):
        out.append(_line(L, Y(10**k), L + pw, Y(10**k), "grid"))
        out.append(_text(L - 8, Y(10**k) + 4, _si(10**k), "end", "tick"))
    out.append(_line(L, T, L, T + ph, "axis") + _line(L, T + ph, L + pw, T + ph, "axis"))
    out.append(_text(L + pw / 2, H - 8, "arithmetic intensity (FLOP per byte moved), log scale", "middle"))
    out.append(_text(18, T + ph / 2, "FLOP/s, log scale", "middle", extra=f' transform="rotate(-90 18 {T + ph / 2:.1f})"'))
    # the roof: from the left edge (or where the slope enters the plot) to the ridge, then flat
    xl = max(10**x0, 10**y0 / bw)
    roof = f"M{X(xl):.1f},{Y(bw * xl):.1f} L{X(ridge):.1f},{Y(peak):.1f} L{X(10**x1):.1f},{Y(peak):.1f}"
    out.append(f'<path d="{roof}" fill="none" stroke="#1d1f23" stroke-width="2.4"/>')
    # slope label, rotated along the line
    ang = -math.degrees(math.atan2(Y(bw * xl) - Y(peak), X(ridge) - X(xl)))
    # along the slope, as far (in x) from the plotted points as possible
    frac = max((0.2, 0.5, 0.8), key=lambda q: min(abs(X(xl) + (X(ridge) - X(xl)) * q - X(p["ai"])) for p in pts))
    sx = X(xl) + (X(ridge) - X(xl)) * frac
    sy = Y(bw * 10 ** (math.log10(xl) + (math.log10(ridge) - math.log10(xl)) * frac)) - 8
    out.append(_text(sx, sy, f"memory bandwidth {_si(bw, 'B/s')}", "middle", "lbl",
                     f' transform="rotate({ang:.1f} {sx:.1f} {sy:.1f})"'))
    out.append(_text(X(10**x1) - 6, Y(peak) - 8, f"matmul {_si(peak, 'FLOP/s')}", "end"))
    out.append(_line(X(ridge), Y(peak), X(ridge), T + ph, "ref"))
    out.append(_text(X(ridge) + 4, T + ph - 6, f"ridge {ridge:.3g} FLOP/B", "start", "small"))
    for i, p in enumerate(pts):
        x, y, ya = X(p["ai"]), Y(p["achieved"]), Y(p["attainable"])
        out.append(_line(x, y, x, ya, style=f"stroke:{p['color']};stroke-width:1.4;stroke-dasharray:2 3"))
        out.append(_marker(x, ya, p["color"], p["shape"], 4, f"{p['label']}: attainable {_si(p['attainable'], 'FLOP/s')}", hollow=True))
        out.append(_marker(x, y, p["color"], p["shape"], 5.5, p["tip"]))
        dx = 10 if i % 2 == 0 else -10
        anchor = "start" if dx > 0 else "end"
        out.append(_text(x + dx, y + 4, p["label"], anchor, "lbl", f' style="fill:{p["color"]};font-weight:600"'))
        out.append(_text(x + dx, y + 18, p["sub"], anchor, "small"))
    out.append("</svg>")
    return "".join(out)


def profile_chart(cats: list[tuple[str, float, float]]) -> str:
    """Horizontal bars of category shares, largest first: (label, share, seconds)."""
    W, L, R, T, row = 760, 190, 120, 12, 28
    H = T + row * len(cats) + 30
    pw = W - L - R
    top = max([s for _, s, _ in cats] + [1e-9])
    _, hi, ticks = _lin_ticks(0.0, top, 5)
    out = [_svg_open(W, H, "Profile: share of the profiled stock run by category")]
    for t in ticks:
        x = L + pw * t / hi
        out.append(_line(x, T, x, T + row * len(cats), "grid"))
        out.append(_text(x, T + row * len(cats) + 16, f"{t * 100:.0f}%", "middle", "tick"))
    for i, (label, share, secs) in enumerate(cats):
        y = T + i * row
        color = "#9aa1ab" if label.startswith("idle") else PALETTE[0]
        w = pw * share / hi
        out.append(f'<rect x="{L}" y="{y + 5:.1f}" width="{max(w, 0.5):.1f}" height="{row - 10}" fill="{color}" rx="2">'
                   f"<title>{_e(label)}: {share * 100:.1f}%, {secs:.4f} s</title></rect>")
        out.append(_text(L - 8, y + row / 2 + 4, label, "end"))
        out.append(_text(L + w + 6, y + row / 2 + 4, f"{share * 100:.1f}%  ({secs:.3g} s)", "start", "small"))
    out.append(_line(L, T, L, T + row * len(cats), "axis"))
    out.append("</svg>")
    return "".join(out)


def action_path_chart(steps: list[dict[str, Any]], final: dict[str, Any]) -> str:
    """Step chart of the cumulative gain over the kept changes (the product of
    the per-step ratios), whiskers from each step's interval, and the final
    measured comparison against stock as a dashed line with its band."""
    cum, c = [1.0], 1.0
    for s in steps:
        c *= float(s["ratio"])
        cum.append(c)
    whisk = []
    for i, s in enumerate(steps):
        lo_, hi_ = _num(s.get("ci_low")), _num(s.get("ci_high"))
        whisk.append((cum[i] * lo_, cum[i] * hi_) if lo_ is not None and hi_ is not None else None)
    fr, fl, fh = _num(final.get("ratio")), _num(final.get("ci_low")), _num(final.get("ci_high"))
    vals = cum + [v for w in whisk if w for v in w] + [v for v in (fr, fl, fh) if v is not None and final.get("ledger_seq")]
    lo, hi, ticks = _lin_ticks(min(vals), max(vals), 6)
    W, H, L, R, T, B = 760, 330, 64, 24, 20, 52
    pw, ph = W - L - R, H - T - B
    n = len(cum)
    band = pw / n

    def X(i: int) -> float:
        return L + band * (i + 0.5)

    def Y(v: float) -> float:
        return T + ph * (1 - (v - lo) / (hi - lo))

    out = [_svg_open(W, H, "Action path: cumulative gain over stock after each kept change")]
    out += _ratio_axes(ticks, Y, L, T, pw, ph)
    out.append(_text(16, T + ph / 2, "cumulative ratio vs stock", "middle", extra=f' transform="rotate(-90 16 {T + ph / 2:.1f})"'))
    out.append(_line(L, Y(1.0), L + pw, Y(1.0), "ref"))
    if final.get("ledger_seq") and fr is not None:
        if fl is not None and fh is not None:
            out.append(f'<rect x="{L}" y="{Y(fh):.1f}" width="{pw}" height="{max(0.5, Y(fl) - Y(fh)):.1f}" '
                       f'fill="{FINAL_COLOR}" fill-opacity="0.08"><title>final vs stock interval '
                       f'[{fl:.3f}, {fh:.3f}] (ledger #{_e(final["ledger_seq"])})</title></rect>')
        out.append(_line(L, Y(fr), L + pw, Y(fr), style=f"stroke:{FINAL_COLOR};stroke-width:1.4;stroke-dasharray:7 4"))
        out.append(_text(L + 6, Y(fr) - 6, f"final vs stock, measured: {_x(fr)} (ledger #{final['ledger_seq']})",
                         "start", "small", f' style="fill:{FINAL_COLOR}"'))
    d = f"M{X(0):.1f},{Y(cum[0]):.1f}"
    for i in range(1, n):
        d += f" H{X(i):.1f} V{Y(cum[i]):.1f}"
    out.append(f'<path d="{d}" fill="none" stroke="#1d1f23" stroke-width="2.2"/>')
    out.append(_marker(X(0), Y(1.0), STOCK_COLOR, "circle", 5, "stock: 1.000"))
    out.append(_text(X(0), T + ph + 18, "stock", "middle", "tick"))
    for i, s in enumerate(steps, start=1):
        if whisk[i - 1]:
            out.append(_whisker(X(i), Y(whisk[i - 1][0]), Y(whisk[i - 1][1]), "#1d1f23"))
        tip = (f"trial {s.get('trial')}: {_pct(s['ratio'])} vs the stack before it; cumulative {_x(cum[i])} "
               f"(ledger #{s.get('ledger_seq')})")
        out.append(_marker(X(i), Y(cum[i]), "#1d1f23", "circle", 5, tip))
        out.append(_text(X(i) + 8, Y(cum[i]) - 8, f"{_pct(s['ratio'])} (#{s.get('ledger_seq')})", "start", "small"))
        out.append(_text(X(i), T + ph + 18, f"trial {s.get('trial')}", "middle", "tick"))
        out.append(_text(X(i), T + ph + 32, f"cycle {s.get('cycle')}", "middle", "small"))
    out.append("</svg>")
    return "".join(out)


# ----------------------------------------------------------------- sections
def _summary(b: dict[str, Any]) -> str:
    s, f = b.get("stock") or {}, b.get("final") or {}
    out = []
    if f.get("ledger_seq") and _num(f.get("ratio")) is not None:
        r = float(f["ratio"])
        cls = "good" if (_num(f.get("ci_low")) or 0) > 1 else "bad" if (_num(f.get("ci_high")) or 2) < 1 else ""
        q = f.get("quality_passed")
        qtag = ('<span class="tag good">held-out quality: pass</span>' if q else
                '<span class="tag bad">held-out quality: FAIL</span>' if q is False else
                '<span class="tag">held-out quality: not evaluated</span>')
        out.append(f'<div class="headline"><div>Final stack vs stock (paired, the headline)</div>'
                   f'<div class="big {cls}">{_x(r)} ({_pct(r)})</div>'
                   f"<div>interval [{_pct(f.get('ci_low'))}, {_pct(f.get('ci_high'))}] over {_e(f.get('n_pairs'))} pairs, "
                   f"protocol {_e(f.get('protocol_verdict'))}; {_f(f.get('objective_median'))} vs "
                   f"{_f(f.get('stock_median_same_run'))} {_e(b.get('objective_label') or 'output tok/s')} "
                   f"{_cite(f['ledger_seq'])} {qtag}</div></div>")
        if f.get("quality_failed"):
            out.append(f"<p>Quality checks failed: {_e(', '.join(map(str, f['quality_failed'])))} {_cite(f['ledger_seq'])}</p>")
    else:
        out.append(f'<div class="headline"><div>Final stack vs stock</div><div class="big">{_x(f.get("ratio", 1.0))}</div>'
                   f"<div>{_e(f.get('note') or 'nothing was kept: the final stack is stock')} "
                   f"{_cite(b.get('close_ledger_seq'))}</div></div>")
    rows = []
    if s:
        rows.append(("Stock", f"{_f(s.get('objective_median'))} {_e(b.get('objective_label') or 'output tok/s')} "
                              f"(median of the A/A runs) {_cite(s.get('ledger_seq'))}"))
        nz = s.get("noise") or {}
        if nz:
            floor = _num(nz.get("ratio"))
            rows.append(("A/A noise floor",
                         f"stock against a second stock instance: ratio {_f(nz.get('ratio'), '.4f')} "
                         f"[{_f(nz.get('ci_low'), '.4f')}, {_f(nz.get('ci_high'), '.4f')}] over {_e(nz.get('n_pairs'))} pairs; "
                         f"a keep's lower bound must clear {_f(abs(floor - 1) * 100 if floor is not None else None, '.2f')}% "
                         f"as well as the minimum gain {_cite(s.get('ledger_seq'))}"))
    rows.append(("Stop reason", f"{_e(b.get('stop_reason'))} {_cite(b.get('close_ledger_seq'))}"))
    rows.append(("Kept without a quality verdict", f"{_e(b.get('unscored_keep_count', 0))} "
                 f"{_cite([a.get('ledger_seq') for a in b.get('action_path', []) if a.get('quality_passed') is None] or b.get('close_ledger_seq'))}"))
    wr = b.get("warm_replay")
    if wr:
        if wr.get("chosen") is None:
            txt = "no recipe above the confidence threshold: started from stock"
        else:
            txt = (f"recipe {_e(wr.get('chosen'))} (confidence {_f(wr.get('confidence'), '.2f')}); "
                   + (f"replayed, verdicts {_cite(wr.get('replayed'))}" if wr.get("replayed") else "not adopted"))
        rows.append(("Warm replay (knowledge base)", f"{txt} {_cite(wr.get('ledger_seq'))}"))
    rf = (b.get("roofline") or {})
    if (rf.get("stock") or {}).get("fraction") is not None:
        st_ = rf["stock"]
        rows.append(("Roofline", f"stock at {st_['fraction'] * 100:.1f}% of the {_f(st_.get('ceiling_tok_per_s'), ',.0f')} tok/s "
                     f"ceiling, headroom {_x(st_.get('headroom'), 2)} {_cite((rf.get('ledger_seqs') or [None])[0])}"))
    out.append('<dl class="kv">' + "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>")
    sc, fc = b.get("stock_config") or {}, b.get("final_config") or {}
    if sc or fc:
        keys = list(dict.fromkeys(list(sc) + list(fc)))
        changed = ["changed" if sc.get(k) != fc.get(k) else "" for k in keys]
        out.append(f"<h3>Configuration: stock and final {_cite(b.get('close_ledger_seq'))}</h3>")
        out.append(_table([("knob", False), ("stock", False), ("final", False)],
                          [[f"<code>{_e(k)}</code>", _e(sc.get(k)), _e(fc.get(k))] for k in keys], changed))
    return "".join(out)


def _action_path(b: dict[str, Any]) -> str:
    path = b.get("action_path") or []
    final = b.get("final") or {}
    if not path:
        return _absent("Nothing was kept: every candidate was rejected or refused (see below), so the final stack is stock "
                       f"and there is no path to draw {_cite(b.get('close_ledger_seq'))}.")
    out = []
    drawable = [a for a in path if _num(a.get("ratio")) is not None]
    if len(drawable) == len(path):
        out.append("<figure>" + action_path_chart(path, final) + "<figcaption>Each step is one kept change, measured paired "
                   "against the stack before it; the line multiplies the steps' ratios (whiskers: each step's interval, scaled "
                   "by the cumulative ratio before it). The dashed line and band are the final stack measured against stock "
                   "directly: that is the headline, the product is only the path to it.</figcaption></figure>")
    else:
        out.append(_absent("The step chart needs a ratio for every kept step; some lack one (see the table)."))
    rows, c = [], 1.0
    for a in path:
        r = _num(a.get("ratio"))
        c = c * r if r is not None else c
        q = a.get("quality_passed")
        rows.append([_e(a.get("trial")), _e(a.get("cycle")), _changes(a.get("changes")), _pct(r),
                     f"[{_pct(a.get('ci_low'))}, {_pct(a.get('ci_high'))}]", _x(c),
                     "pass" if q else "FAIL" if q is False else "unscored", _cite(a.get("ledger_seq"))])
    out.append(_table([("trial", True), ("cycle", True), ("change", False), ("gain vs the stack before", True),
                       ("interval", True), ("cumulative", True), ("quality", False), ("ledger", False)], rows))
    return "".join(out)


def _rejected(b: dict[str, Any]) -> str:
    rej, refs = b.get("rejected") or [], b.get("refusals") or []
    out = []
    if rej:
        out.append(_table([("trial", True), ("change", False), ("outcome", False), ("gain", True), ("interval", True),
                           ("why", False), ("ledger", False)],
                          [[_e(r.get("trial")), _changes(r.get("changes")), f'<span class="tag">{_e(r.get("outcome"))}</span>',
                            _pct(r.get("ratio")), f"[{_pct(r.get('ci_low'))}, {_pct(r.get('ci_high'))}]", _e(r.get("lesson")),
                            _cite(r.get("ledger_seq"))] for r in rej]))
    else:
        out.append(_absent("No measured candidate was rejected: every trial was kept."))
    out.append("<h3>Refused before measurement</h3>")
    if refs:
        out.append(_table([("rule", False), ("agent", False), ("why", False), ("ledger", False)],
                          [[f"<code>{_e(r.get('rule'))}</code>", _e(r.get("agent")), _e(r.get("why")), _cite(r.get("ledger_seq"))]
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
                   f"{_e(b['objective_unit'] or '(none given)')}</p>")
    rows = []
    for p in b.get("patches") or []:
        if p.get("kept"):
            what = f'<span class="tag good">kept</span> commit <code>{_e(str(p.get("commit"))[:10])}</code>'
        elif p.get("gate") == "measure":
            what = (f'<span class="tag bad">rejected after measurement</span> '
                    f"<code>{_e(p.get('rule') or p.get('outcome'))}</code>")
        else:
            what = f'<span class="tag">refused at gate {_e(p.get("gate"))}</span> <code>{_e(p.get("rule"))}</code>'
        measured = p.get("gate") == "measure" or p.get("kept")
        why = "; ".join(p.get("quality_failed") or []) or p.get("why") or p.get("outcome") or ""
        rows.append([f"<code>{_e(p.get('id'))}</code>", _e(p.get("title")), what,
                     _pct(p.get("ratio")) if measured else "",
                     f"[{_pct(p.get('ci_low'))}, {_pct(p.get('ci_high'))}]" if measured else "",
                     _e(why), _cite(p.get("ledger_seq"))])
    if rows:
        out.append(_table([("patch", False), ("hypothesis", False), ("outcome", False), ("gain", True),
                           ("interval", True), ("why", False), ("ledger", False)], rows))
    else:
        out.append(_absent("No patch was proposed."))
    d = b.get("rollback_drill")
    if d:
        band = f", stock's own band [{_pct(d['band'][0])}, {_pct(d['band'][1])}]" if d.get("band") else ""
        out.append(f"<p>Rollback drill: <strong>{'passed' if d.get('passed') else 'FAILED'}</strong>: {_e(d.get('why'))}; "
                   f"reverted {len(d.get('reverted') or [])} commit(s), tree identical to stock: "
                   f"{_e(d.get('tree_identical'))}, rolled-back vs stock {_pct(d.get('ratio'))} "
                   f"[{_pct(d.get('ci_low'))}, {_pct(d.get('ci_high'))}]{_e(band)} {_cite(d.get('ledger_seq'))}</p>")
    return "".join(out)


def _profile(b: dict[str, Any]) -> str:
    pr = b.get("profile")
    if not pr:
        return _absent("The ledger has no profile entry: this session ran no profiler. The synthetic adapter runs no "
                       "operators, so PRELUDE skips profiling for it (sessions from before profiling existed have none either).")
    if pr.get("error") or not pr.get("categories"):
        why = f"the profiler failed: {_e(pr.get('error'))}" if pr.get("error") else "the profile recorded no categories"
        return _absent(f"No breakdown: {why} {_cite(pr.get('ledger_seq'))}.")
    cats = sorted(((c.get("label") or name, _num(c.get("share")) or 0.0, _num(c.get("seconds")) or 0.0)
                   for name, c in pr["categories"].items()), key=lambda t: -t[1])
    out = [f"<p>One untimed stock run under torch.profiler, wall {_f(pr.get('wall_s'), '.3f')} s {_cite(pr.get('ledger_seq'))}. "
           "Shares are of the profiled wall time (profiling inflates absolute seconds; the shares are what it is for). "
           "Grey: host idle / launch gaps, the time no operator was running.</p>",
           "<figure>" + profile_chart(cats) + f"<figcaption>Category shares {_cite(pr.get('ledger_seq'))}.</figcaption></figure>"]
    ops = pr.get("top_ops") or []
    if ops:
        out.append(f"<h3>Top operators {_cite(pr.get('ledger_seq'))}</h3>")
        out.append(_table([("operator", False), ("category", False), ("share", True), ("seconds", True), ("calls", True)],
                          [[f"<code>{_e(o.get('name'))}</code>", _e(o.get("category")), f"{(_num(o.get('share')) or 0) * 100:.1f}%",
                            _f(o.get("seconds"), ".4f"), _e(o.get("count"))] for o in ops]))
    return "".join(out)


def _roof_point(label: str, r: dict[str, Any], seq: Any, color: str, shape: str) -> dict[str, Any] | None:
    d = r.get("decode_step") or {}
    flops, nbytes = _num(d.get("flops")), _num(d.get("bytes"))
    meas, batch, floor = _num(r.get("measured_tok_per_s")), _num(r.get("batch")), _num(d.get("floor_s"))
    if not (flops and nbytes and meas and batch and floor):
        return None
    achieved = flops * meas / batch  # decode steps per second (prefill time counted against it) x FLOPs per step
    frac = _num(r.get("decode_only_fraction"))
    return {"label": label, "ai": flops / nbytes, "achieved": achieved, "attainable": flops / floor, "color": color,
            "shape": shape, "sub": f"{frac * 100:.1f}% of the roof (#{seq})" if frac is not None else f"#{seq}",
            "tip": f"{label}: {flops / nbytes:.3g} FLOP/B, {_si(achieved, 'FLOP/s')} (ledger #{seq})"}


def _roofline(b: dict[str, Any]) -> str:
    rf = b.get("roofline")
    if not rf:
        return _absent("The ledger has no roofline entry: this session measured no device ceilings (sessions from before "
                       "the roofline existed have none).")
    seqs = rf.get("ledger_seqs") or []
    s_seq = rf.get("stock_seq") or (seqs[0] if seqs else None)
    f_seq = rf.get("final_seq") or (seqs[-1] if seqs else None)
    kept = rf.get("kept") or []
    st_, fi, ce = rf.get("stock") or {}, rf.get("final") or {}, rf.get("ceilings") or {}
    if not st_ or not ce:
        return _absent("No roofline: the ceilings were not measured or the cost model was not applied. The synthetic "
                       "adapter has no model to cost, so its sessions record an empty roofline entry; otherwise PRELUDE "
                       f"could not measure this device's ceilings {_cite(seqs)}.")
    out = [f"<p>Measured ceilings of {_e(ce.get('device_name'))}: memory bandwidth "
           f"{_f((_num(ce.get('memory_bandwidth_bytes_per_s')) or 0) / 1e9, ',.1f')} GB/s, matmul "
           f"{_f((_num(ce.get('matmul_flops_per_s')) or 0) / 1e12, ',.3f')} TFLOP/s ({_e(ce.get('matmul_dtype') or '')}), "
           f"measured {_e(ce.get('measured_at'))}{' (cached in the knowledge base)' if ce.get('cached') else ''} {_cite(s_seq)}.</p>"]
    pts = [p for p in (_roof_point("stock", st_, s_seq, STOCK_COLOR, "circle"),
                       _roof_point("final", fi, f_seq, FINAL_COLOR, "diamond") if fi else None) if p]
    if pts and _num(ce.get("memory_bandwidth_bytes_per_s")) and _num(ce.get("matmul_flops_per_s")):
        out.append("<figure>" + roofline_chart(ce, pts) + "<figcaption>Log-log roofline of one decode step (the phase that "
                   "dominates a generation): the roof is min(bandwidth x intensity, matmul rate) from the measured ceilings. "
                   "A filled marker is the achieved rate, (measured output tok/s / batch) x FLOPs per step, so prefill time "
                   "counts against it; the hollow marker above it is the roof at that intensity. "
                   f"{_cite([s_seq] + ([f_seq] if fi else []))}</figcaption></figure>")
    rows = []
    stacks = [("stock", st_, s_seq)] + [(f"after trial {k['trial']}", k.get("roofline") or {}, k.get("ledger_seq"))
                                        for k in kept] + [("final", fi, f_seq)]
    for name, r, seq in stacks:
        if not r:
            continue
        d, p = r.get("decode_step") or {}, r.get("prefill") or {}
        ai_d = (_num(d.get("flops")) or 0) / (_num(d.get("bytes")) or 1)
        ai_p = (_num(p.get("flops")) or 0) / (_num(p.get("bytes")) or 1)
        rows.append([_e(name) + (' <span class="tag bad">suspect</span>' if r.get("suspect") else ""),
                     _f(r.get("measured_tok_per_s")), _f(r.get("ceiling_tok_per_s"), ",.0f"),
                     f"{(_num(r.get('fraction')) or 0) * 100:.1f}% / {(_num(r.get('decode_only_fraction')) or 0) * 100:.1f}%",
                     _x(r.get("headroom"), 2), f"{ai_d:.3g} {_e(d.get('bound'))} / {ai_p:.3g} {_e(p.get('bound'))}",
                     _cite(seq)])
    out.append(_table([("stack", False), ("measured tok/s", True), ("ceiling tok/s", True),
                       ("fraction: run / decode only", True), ("headroom", True),
                       ("FLOP/B: decode / prefill (bound)", True), ("ledger", False)], rows))
    if st_.get("reason"):
        out.append(f'<p><span class="tag bad">suspect</span> stock: {_e(st_["reason"])} {_cite(s_seq)}</p>')
    if fi.get("reason"):
        out.append(f'<p><span class="tag bad">suspect</span> final: {_e(fi["reason"])} {_cite(f_seq)}</p>')
    am = rf.get("amdahl") or {}
    if am:
        tag = '<span class="tag bad">suspect</span>' if am.get("suspect") else f'<span class="tag good">{_e(am.get("verdict"))}</span>'
        out.append(f"<p>Amdahl / roofline check of the final gain: measured {_x(am.get('measured_gain'))} against at most "
                   f"{_x(am.get('max_possible_gain'), 2)} (the stock headroom) {tag} {_e(am.get('reason') or '')} {_cite(f_seq)}</p>")
    if not fi:
        why = ("nothing was kept, so the final stack is stock" if not (b.get("final") or {}).get("ledger_seq")
               else "the ledger has no roofline for the final stack")
        out.append(f'<p class="note">No final-stack point: {_e(why)}.</p>')
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
                reasons.append(f"{_e(phases[i + 1].get('why'))} {_cite(phases[i + 1].get('ledger_seq'))}")
        why = "; ".join(reasons) if reasons else "SWEEP did not run (disabled with --no-sweep, or the budget ran out)"
        return _absent(f"No sweep measurement in the ledger: {why}.")
    ok = [p for p in pts if _num(p.get("ratio")) is not None and p.get("point")]
    latest: dict[tuple, dict[str, Any]] = {}
    for p in ok:  # the final stack's sweep is the last cycle's
        k = tuple(p["point"])
        if k not in latest or (p.get("cycle") or 0) >= (latest[k].get("cycle") or 0):
            latest[k] = p
    out = []
    if latest:
        cycles = sorted({p.get("cycle") for p in latest.values()}, key=lambda c: c or 0)
        failed = [p for p in pts if _num(p.get("ratio")) is None and p.get("point") and tuple(p["point"]) not in latest]
        out.append("<figure>" + sweep_chart(list(latest.values()), failed) + "<figcaption>Throughput of the final stack "
                   "over stock at each operating point (paired, a fixed number of pairs per point: descriptive, not a keep "
                   "decision); whiskers are the intervals, the dashed line is parity"
                   + (", a cross on the axis is a point that failed" if failed else "") + f". Cycle {', '.join(map(str, cycles))}. "
                   f"{_cite([p['ledger_seq'] for p in sorted(latest.values(), key=lambda p: p['ledger_seq'])])}</figcaption></figure>")
    else:
        out.append(_absent("Every sweep point failed: nothing to plot (see the table)."))
    rows = [[_e(p.get("cycle")), _e((p.get("point") or [None, None])[0]), _e((p.get("point") or [None, None])[1]),
             _x(p.get("ratio")) if _num(p.get("ratio")) is not None else "failed",
             f"[{_f(p.get('ci_low'), '.3f')}, {_f(p.get('ci_high'), '.3f')}]" if _num(p.get("ratio")) is not None else "",
             _cite(p.get("ledger_seq"))] for p in pts]
    out.append(_table([("cycle", True), ("concurrency", True), ("input len", True), ("ratio", True), ("interval", True),
                       ("ledger", False)], rows))
    return "".join(out)


def _time(b: dict[str, Any]) -> str:
    t = b.get("time_s") or {}
    if not t:
        return _absent("No timing in the breakdown.")
    total = _num(t.get("total")) or 0.0
    rows = []
    for k in ("total", "benchmark_runs", "compilation", "warmup_excluding_compilation", "quality_probes", "harness"):
        v = _num(t.get(k)) or 0.0
        rows.append([_e(k.replace("_", " ")), f"{v:.1f}", f"{v / total * 100:.0f}%" if total > 0 and k != "total" else ""])
    return (f"<p>Total from the close entry {_cite(b.get('close_ledger_seq'))}; the parts are sums over the measurement "
            "entries' timings, the harness is the rest.</p>"
            + _table([("", False), ("seconds", True), ("share", True)], rows))


def _predicted(b: dict[str, Any]) -> str:
    pm = b.get("predicted_vs_measured") or []
    if not pm:
        return _absent("No trial was measured.")
    rows = []
    for p in pm:
        pg = _num(p.get("predicted_gain"))
        rows.append([_e(p.get("trial")), _changes(p.get("changes")), "n/a" if pg is None else f"{pg * 100:+.0f}%",
                     _pct(p.get("measured_ratio")), _cite(p.get("ledger_seq"))])
    return _table([("trial", True), ("change", False), ("predicted", True), ("measured", True), ("ledger", False)], rows)


def _phases(b: dict[str, Any]) -> str:
    ph = b.get("phases") or []
    if not ph:
        return _absent("No phase transition in the ledger.")
    return _table([("from", False), ("to", False), ("why", False), ("ledger", False)],
                  [[_e(p.get("from") or "—"), _e(p.get("to") or "(skip)"), _e(p.get("why")), _cite(p.get("ledger_seq"))]
                   for p in ph])


# --------------------------------------------------------------------- page
def render_html(b: dict[str, Any], *, manifest: dict[str, Any] | None = None, title: str | None = None) -> str:
    """The whole page, from a breakdown dict. ``manifest`` (optional) names
    the workload in the page header (model, framework, device, traffic)."""
    spec = (manifest or {}).get("spec") or {}
    head = title or "inferloom session report"
    sub = ""
    if spec:
        t = spec.get("traffic") or {}
        sub = (f"{spec.get('model')} on {spec.get('framework')} / {spec.get('device')} ({spec.get('dtype')}); "
               f"traffic {t.get('concurrency')} concurrent, {t.get('input_len')} in / {t.get('output_len')} out "
               f"(spec, manifest.json); session {(manifest or {}).get('seeds', {}).get('session_id', '')}")
    body = {
        "summary": _summary(b),
        "action-path": _action_path(b),
        "rejected": _rejected(b),
        "patches": _patches(b),
        "profile": _profile(b),
        "roofline": _roofline(b),
        "sweep": _sweep(b),
        "time": _time(b),
        "predicted": _predicted(b),
        "phases": _phases(b),
    }
    shown = {k: v for k, v in SECTIONS.items() if body[k] is not None}
    nav = "".join(f'<a href="#{k}">{_e(v)}</a>' for k, v in shown.items())
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{_e(head)}</title><style>{_CSS}</style></head><body><main>",
             f"<h1>{_e(head)}</h1>", f'<p class="sub">{_e(sub)}</p>' if sub else "",
             '<p class="note">Every number cites the ledger entry it comes from (ledger #N: the seq in ledger.jsonl); '
             "the page is re-rendered from the ledger alone.</p>", f"<nav>{nav}</nav>"]
    for k, v in shown.items():
        parts.append(f'<section id="{k}"><h2>{_e(v)}</h2>{body[k]}</section>')
    parts.append("</main></body></html>")
    return "\n".join(p for p in parts if p) + "\n"


def write_html(directory: Path | str, out: Path | str | None = None, breakdown: dict[str, Any] | None = None) -> Path:
    """Render the session in ``directory`` (from its ledger, unless a
    ``breakdown`` is given) to ``out`` (default ``DIR/report.html``), atomically."""
    d = Path(directory)
    if breakdown is None:
        from inferloom.session import ledger as L
        from inferloom.session.close import breakdown_from_ledger

        breakdown = breakdown_from_ledger(L.read_entries(d))
    manifest = None
    mp = d / "manifest.json"
    if mp.is_file():
        try:
            manifest = json.loads(mp.read_text())
        except (OSError, ValueError):
            manifest = None
    path = Path(out) if out else d / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(render_html(breakdown, manifest=manifest), encoding="utf-8")
    tmp.replace(path)
    return path
