"""The Roofline section of the HTML report for an image workload (``framework: diffusers``): its
rooflines are per denoising step, objective images/s (:func:`inferloom.measure.diffusion_costs.image_roofline`),
so the LLM section's decode-step point and token columns do not apply (the frame they share:
:func:`inferloom.report.html_roofline.roofline_body`). :func:`render_html <inferloom.report.html.render_html>`
uses :func:`image_roofline_body` when the stock roofline's unit is images/s."""

from __future__ import annotations

from typing import Any

from inferloom.report.fmt import esc, num, number, ratio_x, si
from inferloom.report.html_roofline import roofline_body

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


def _row(r: dict[str, Any]) -> list[str]:
    return [number(r.get("measured_images_per_s"), ",.4g"), number(r.get("ceiling_images_per_s"), ",.4g"),
            _pct(num(r.get("fraction"))), ratio_x(r.get("headroom"), 2),
            _ai(r.get("denoise_step") or {}), _ai(r.get("decode") or {}), _pct(num(r.get("step_share_of_floor")))]


def image_roofline_body(b: dict[str, Any]) -> str:
    rf = b.get("roofline") or {}
    st_ = rf.get("stock") or {}
    return roofline_body(
        rf, absent="No roofline: the ceilings were not measured",
        workload=(f" Workload: {esc(st_.get('width'))}x{esc(st_.get('height'))}, {esc(st_.get('steps'))} steps, batch "
                  f"{esc(st_.get('batch'))}{', classifier-free guidance (two branches per step)' if st_.get('cfg') else ''}."),
        point=_point, chart_title="Roofline: attainable FLOP/s against arithmetic intensity, with the stock and final "
        "denoising steps",
        caption="Log-log roofline of one denoising step (FLOPs of the denoiser at the workload's shape; bytes: its weights "
        "read once, so the intensity is an upper bound): the roof is min(bandwidth x intensity, matmul rate) from the "
        "measured ceilings. A filled marker is the achieved rate, (measured images/s / batch) x steps x FLOPs per step, so "
        "the VAE decode and the text encoders count against it; the hollow marker above it is the roof at that intensity. ",
        columns=[("measured images/s", True), ("ceiling images/s", True), ("fraction", True), ("headroom", True),
                 ("FLOP/B: denoising step (bound)", True), ("FLOP/B: VAE decode (bound)", True),
                 ("steps' share of the floor", True)],
        row=_row, no_final="nothing was kept, or the ledger has no roofline for the final stack")
