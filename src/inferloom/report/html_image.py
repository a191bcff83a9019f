"""The Roofline section of the HTML report for an image workload (``framework: diffusers``): its
rooflines are per denoising step, objective images/s (:func:`inferloom.measure.diffusion_costs.image_roofline`),
so the LLM section's decode-step point and token columns do not apply. :func:`render_html
<inferloom.report.html.render_html>` uses :func:`image_roofline_body` when the stock roofline's unit is
images/s."""

from __future__ import annotations

from typing import Any

from inferloom.report.fmt import esc, num, number, ratio_x, si
from inferloom.report.html_blocks import _absent, _cite, _table
from inferloom.report.svg import FINAL_COLOR, STOCK_COLOR, roofline_chart

__all__ = ["is_image_roofline", "image_roofline_body"]


def is_image_roofline(b: dict[str, Any]) -> bool:
    """Whether the breakdown's stock roofline is an image workload's (unit images/s)."""
    return (((b.get("roofline") or {}).get("stock")) or {}).get("unit") == "images/s"


def _point(label: str, r: dict[str, Any], seq: Any, color: str, shape: str) -> dict[str, Any] | None:
    s = r.get("denoise_step") or {}
    flops, nbytes, floor = num(s.get("flops")), num(s.get("bytes")), num(s.get("floor_s"))
    meas, batch, steps = num(r.get("measured_images_per_s")), num(r.get("batch")), num(r.get("steps"))
    if not (flops and nbytes and floor and meas and batch and steps):
        return None
    achieved = flops * steps * meas / batch  # denoising steps per second (decode time counted against it) x FLOPs
    frac = num(r.get("fraction"))
    return {"label": label, "ai": flops / nbytes, "achieved": achieved, "attainable": flops / floor, "color": color,
            "shape": shape, "sub": f"{frac * 100:.1f}% of the ceiling (#{seq})" if frac is not None else f"#{seq}",
            "tip": f"{label}: {flops / nbytes:.3g} FLOP/B, {si(achieved, 'FLOP/s')} per denoising step (ledger #{seq})"}


def _pct(v: float | None) -> str:
    return f"{v * 100:.1f}%" if v is not None else "—"


def _ai(phase: dict[str, Any]) -> str:
    ai = (num(phase.get("flops")) or 0) / (num(phase.get("bytes")) or 1)
    return f"{ai:.3g} {esc(phase.get('bound'))}"


def image_roofline_body(b: dict[str, Any]) -> str:
    rf = b.get("roofline") or {}
    seqs = rf.get("ledger_seqs") or []
    s_seq = rf.get("stock_seq") or (seqs[0] if seqs else None)
    f_seq = rf.get("final_seq") or (seqs[-1] if seqs else None)
    st_, fi, ce = rf.get("stock") or {}, rf.get("final") or {}, rf.get("ceilings") or {}
    if not st_ or not ce:
        return _absent(f"No roofline: the ceilings were not measured {_cite(seqs)}.")
    bw, peak = num(ce.get("memory_bandwidth_bytes_per_s")), num(ce.get("matmul_flops_per_s"))
    out = [f"<p>Measured ceilings of {esc(ce.get('device_name'))}: memory bandwidth "
           f"{number((bw or 0) / 1e9, ',.1f')} GB/s, matmul {number((peak or 0) / 1e12, ',.3f')} TFLOP/s "
           f"({esc(ce.get('matmul_dtype') or '')}), measured {esc(ce.get('measured_at'))}"
           f"{' (cached in the knowledge base)' if ce.get('cached') else ''} {_cite(s_seq)}. "
           f"Workload: {esc(st_.get('width'))}x{esc(st_.get('height'))}, {esc(st_.get('steps'))} steps, batch "
           f"{esc(st_.get('batch'))}{', classifier-free guidance (two branches per step)' if st_.get('cfg') else ''}."
           "</p>"]
    pts = [p for p in (_point("stock", st_, s_seq, STOCK_COLOR, "circle"),
                       _point("final", fi, f_seq, FINAL_COLOR, "diamond") if fi else None) if p]
    if pts and bw and peak:
        out.append("<figure>" + roofline_chart(ce, pts, title="Roofline: attainable FLOP/s against arithmetic "
                                               "intensity, with the stock and final denoising steps")
                   + "<figcaption>Log-log roofline of one denoising step (FLOPs of the denoiser at the workload's "
                   "shape; bytes: its weights read once, so the intensity is an upper bound): the roof is "
                   "min(bandwidth x intensity, matmul rate) from the measured ceilings. A filled marker is the achieved "
                   "rate, (measured images/s / batch) x steps x FLOPs per step, so the VAE decode and the text encoders "
                   "count against it; the hollow marker above it is the roof at that intensity. "
                   f"{_cite([s_seq] + ([f_seq] if fi else []))}</figcaption></figure>")
    rows = []
    stacks = [("stock", st_, s_seq)] + [(f"after trial {k['trial']}", k.get("roofline") or {}, k.get("ledger_seq"))
                                        for k in rf.get("kept") or []] + [("final", fi, f_seq)]
    for name, r, seq in stacks:
        if not r:
            continue
        share = num(r.get("step_share_of_floor"))
        rows.append([esc(name) + (' <span class="tag bad">suspect</span>' if r.get("suspect") else ""),
                     number(r.get("measured_images_per_s"), ",.4g"), number(r.get("ceiling_images_per_s"), ",.4g"),
                     _pct(num(r.get("fraction"))), ratio_x(r.get("headroom"), 2),
                     _ai(r.get("denoise_step") or {}), _ai(r.get("decode") or {}),
                     _pct(share), _cite(seq)])
    out.append(_table([("stack", False), ("measured images/s", True), ("ceiling images/s", True), ("fraction", True),
                       ("headroom", True), ("FLOP/B: denoising step (bound)", True), ("FLOP/B: VAE decode (bound)", True),
                       ("steps' share of the floor", True), ("ledger", False)], rows))
    for name, r, seq in (("stock", st_, s_seq), ("final", fi, f_seq)):
        if r.get("reason"):
            out.append(f'<p><span class="tag bad">suspect</span> {name}: {esc(r["reason"])} {_cite(seq)}</p>')
    am = rf.get("amdahl") or {}
    if am:
        tag = '<span class="tag bad">suspect</span>' if am.get("suspect") else f'<span class="tag good">{esc(am.get("verdict"))}</span>'
        out.append(f"<p>Amdahl / roofline check of the final gain: measured {ratio_x(am.get('measured_gain'))} against at "
                   f"most {ratio_x(am.get('max_possible_gain'), 2)} (the stock headroom) {tag} {esc(am.get('reason') or '')} "
                   f"{_cite(f_seq)}</p>")
    if not fi:
        out.append('<p class="note">No final-stack point: nothing was kept, or the ledger has no roofline for the '
                   "final stack.</p>")
    return "".join(out)
