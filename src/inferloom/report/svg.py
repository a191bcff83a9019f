"""The HTML report's charts, as inline SVG drawn in Python (no JavaScript, no
image file): the action path's step chart, the sweep's ratio chart, the
profile's category bars and the log-log roofline. Each chart is a function
of plain numbers from the breakdown and returns one ``<svg>`` element."""

from __future__ import annotations

import math
from typing import Any, Sequence

from inferloom.report.fmt import esc, num, number, pct_safe, ratio_x, si

__all__ = ["PALETTE", "STOCK_COLOR", "FINAL_COLOR", "sweep_chart", "roofline_chart", "profile_chart", "action_path_chart"]

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
STOCK_COLOR = "#6b6b6b"
FINAL_COLOR = "#0072B2"


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
            f'role="img" aria-label="{esc(label)}"><title>{esc(label)}</title>')


def _ratio_axes(ticks: list[float], Y: Any, L: float, T: float, pw: float, ph: float) -> list[str]:
    """Horizontal grid lines with their labels, and the two axes, of a ratio chart."""
    out = []
    for t in ticks:
        out.append(_line(L, Y(t), L + pw, Y(t), "grid"))
        out.append(_text(L - 8, Y(t) + 4, _tick_label(t), "end", "tick"))
    out.append(_line(L, T, L, T + ph, "axis") + _line(L, T + ph, L + pw, T + ph, "axis"))
    return out


def _text(x: float, y: float, s: str, anchor: str = "start", cls: str = "lbl", extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" class="{cls}"{extra}>{esc(s)}</text>'


def _line(x1: float, y1: float, x2: float, y2: float, cls: str = "", style: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    s = f' style="{style}"' if style else ""
    return f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}"{c}{s}/>'


def _marker(x: float, y: float, color: str, shape: str = "circle", r: float = 5, tip: str = "", hollow: bool = False) -> str:
    fill = "#ffffff" if hollow else color
    t = f"<title>{esc(tip)}</title>" if tip else ""
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
    vals = [1.0] + [v for p in points for v in (num(p.get("ci_low")), num(p.get("ci_high")), num(p["ratio"])) if v is not None]
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
            cl, ch = num(p.get("ci_low")), num(p.get("ci_high"))
            if cl is not None and ch is not None:
                out.append(_whisker(x, Y(cl), Y(ch), color))
            tip = (f"concurrency {p['point'][0]}, input {p['point'][1]}: {ratio_x(p['ratio'])} "
                   f"[{number(cl, '.3f')}, {number(ch, '.3f')}] (ledger #{p.get('ledger_seq')})")
            out.append(_marker(x, y, color, "circle", 4.5, tip))
        for p in (q for q in failed if int(q["point"][1]) == ln):
            x, y = X(int(p["point"][0]), i), T + ph - 8
            out.append(f'<g stroke="{color}" stroke-width="2.2">{_line(x - 5, y - 5, x + 5, y + 5)}{_line(x - 5, y + 5, x + 5, y - 5)}'
                       f"<title>concurrency {esc(p['point'][0])}, input {esc(p['point'][1])}: failed "
                       f"(ledger #{esc(p.get('ledger_seq'))})</title></g>")
        ly = T + 14 + i * 20
        out.append(_line(L + pw + 16, ly - 4, L + pw + 40, ly - 4, style=f"stroke:{color};stroke-width:2"))
        out.append(_marker(L + pw + 28, ly - 4, color, "circle", 3.5))
        out.append(_text(L + pw + 46, ly, f"input len {ln}"))
    out.append("</svg>")
    return "".join(out)


def roofline_chart(ceilings: dict[str, Any], pts: list[dict[str, Any]], title: str | None = None) -> str:
    """Log-log roofline: attainable FLOP/s = min(bandwidth x intensity, matmul
    rate); ``pts``: {label, ai, achieved, attainable, color, shape, tip}; ``title``: the chart's label."""
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

    out = [_svg_open(W, H, title or "Roofline: attainable FLOP/s against arithmetic intensity, with the stock and final "
                     "decode steps")]
    for k in range(x0, x1 + 1):
        out.append(_line(X(10**k), T, X(10**k), T + ph, "grid"))
        out.append(_text(X(10**k), T + ph + 18, _tick_label(10**k) if -3 <= k <= 4 else f"1e{k}", "middle", "tick"))
    for k in range(y0, y1 + 1):
        out.append(_line(L, Y(10**k), L + pw, Y(10**k), "grid"))
        out.append(_text(L - 8, Y(10**k) + 4, si(10**k), "end", "tick"))
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
    out.append(_text(sx, sy, f"memory bandwidth {si(bw, 'B/s')}", "middle", "lbl",
                     f' transform="rotate({ang:.1f} {sx:.1f} {sy:.1f})"'))
    out.append(_text(X(10**x1) - 6, Y(peak) - 8, f"matmul {si(peak, 'FLOP/s')}", "end"))
    out.append(_line(X(ridge), Y(peak), X(ridge), T + ph, "ref"))
    out.append(_text(X(ridge) + 4, T + ph - 6, f"ridge {ridge:.3g} FLOP/B", "start", "small"))
    for i, p in enumerate(pts):
        x, y, ya = X(p["ai"]), Y(p["achieved"]), Y(p["attainable"])
        out.append(_line(x, y, x, ya, style=f"stroke:{p['color']};stroke-width:1.4;stroke-dasharray:2 3"))
        out.append(_marker(x, ya, p["color"], p["shape"], 4, f"{p['label']}: attainable {si(p['attainable'], 'FLOP/s')}", hollow=True))
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
                   f"<title>{esc(label)}: {share * 100:.1f}%, {secs:.4f} s</title></rect>")
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
        lo_, hi_ = num(s.get("ci_low")), num(s.get("ci_high"))
        whisk.append((cum[i] * lo_, cum[i] * hi_) if lo_ is not None and hi_ is not None else None)
    fr, fl, fh = num(final.get("ratio")), num(final.get("ci_low")), num(final.get("ci_high"))
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
                       f'[{fl:.3f}, {fh:.3f}] (ledger #{esc(final["ledger_seq"])})</title></rect>')
        out.append(_line(L, Y(fr), L + pw, Y(fr), style=f"stroke:{FINAL_COLOR};stroke-width:1.4;stroke-dasharray:7 4"))
        out.append(_text(L + 6, Y(fr) - 6, f"final vs stock, measured: {ratio_x(fr)} (ledger #{final['ledger_seq']})",
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
        tip = (f"trial {s.get('trial')}: {pct_safe(s['ratio'])} vs the stack before it; cumulative {ratio_x(cum[i])} "
               f"(ledger #{s.get('ledger_seq')})")
        out.append(_marker(X(i), Y(cum[i]), "#1d1f23", "circle", 5, tip))
        out.append(_text(X(i) + 8, Y(cum[i]) - 8, f"{pct_safe(s['ratio'])} (#{s.get('ledger_seq')})", "start", "small"))
        out.append(_text(X(i), T + ph + 18, f"trial {s.get('trial')}", "middle", "tick"))
        out.append(_text(X(i), T + ph + 32, f"cycle {s.get('cycle')}", "middle", "small"))
    out.append("</svg>")
    return "".join(out)
