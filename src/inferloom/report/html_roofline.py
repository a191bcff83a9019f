"""The Roofline section of the HTML report: :func:`roofline_body`, the frame an LLM session's decode-step
roofline (:func:`decode_roofline`) and an image session's denoising-step one
(:func:`inferloom.report.html_image.image_roofline_body`) share: the measured ceilings, the chart of the
stock and final points, a table row per stack, the suspect reasons, the Amdahl check. What differs (the
point on the chart, the table's columns, the captions) the caller passes in."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from inferloom.report.fmt import esc, num, number, ratio_x, si
from inferloom.report.html_blocks import _absent, _cite, _table
from inferloom.report.svg import FINAL_COLOR, STOCK_COLOR, roofline_chart

__all__ = ["roofline_body", "decode_roofline"]

PointFn = Callable[[str, dict[str, Any], Any, str, str], "dict[str, Any] | None"]


def roofline_body(rf: dict[str, Any], *, absent: str, workload: str, point: PointFn, chart_title: str | None,
                  caption: str, columns: Sequence[tuple[str, bool]], row: Callable[[dict[str, Any]], list[str]],
                  no_final: str) -> str:
    """The section's HTML from the breakdown's ``roofline``. ``absent``: why there is no roofline (without
    ceilings or a stock point), cited; ``workload``: HTML after the ceilings' sentence; ``point(label, stack,
    seq, color, shape)``: a chart point, or None; ``caption``: the chart's, cited; ``columns`` / ``row(stack)``:
    the table's cells between the stack's name and its citation; ``no_final``: why there is no final point."""
    seqs = rf.get("ledger_seqs") or []
    s_seq = rf.get("stock_seq") or (seqs[0] if seqs else None)
    f_seq = rf.get("final_seq") or (seqs[-1] if seqs else None)
    st_, fi, ce = rf.get("stock") or {}, rf.get("final") or {}, rf.get("ceilings") or {}
    if not st_ or not ce:
        return _absent(f"{absent} {_cite(seqs)}.")
    bw, peak = num(ce.get("memory_bandwidth_bytes_per_s")), num(ce.get("matmul_flops_per_s"))
    out = [f"<p>Measured ceilings of {esc(ce.get('device_name'))}: memory bandwidth "
           f"{number((bw or 0) / 1e9, ',.1f')} GB/s, matmul {number((peak or 0) / 1e12, ',.3f')} TFLOP/s "
           f"({esc(ce.get('matmul_dtype') or '')}), measured {esc(ce.get('measured_at'))}"
           f"{' (cached in the knowledge base)' if ce.get('cached') else ''} {_cite(s_seq)}.{workload}</p>"]
    pts = [p for p in (point("stock", st_, s_seq, STOCK_COLOR, "circle"),
                       point("final", fi, f_seq, FINAL_COLOR, "diamond") if fi else None) if p]
    if pts and bw and peak:
        out.append("<figure>" + roofline_chart(ce, pts, title=chart_title) + "<figcaption>" + caption
                   + f"{_cite([s_seq] + ([f_seq] if fi else []))}</figcaption></figure>")
    rows = []
    stacks = [("stock", st_, s_seq)] + [(f"after trial {k['trial']}", k.get("roofline") or {}, k.get("ledger_seq"))
                                        for k in rf.get("kept") or []] + [("final", fi, f_seq)]
    for name, r, seq in stacks:
        if r:
            rows.append([esc(name) + (' <span class="tag bad">suspect</span>' if r.get("suspect") else "")]
                        + row(r) + [_cite(seq)])
    out.append(_table([("stack", False), *columns, ("ledger", False)], rows))
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
        out.append(f'<p class="note">No final-stack point: {esc(no_final)}.</p>')
    return "".join(out)


def _decode_point(label: str, r: dict[str, Any], seq: Any, color: str, shape: str) -> dict[str, Any] | None:
    d = r.get("decode_step") or {}
    flops, nbytes = num(d.get("flops")), num(d.get("bytes"))
    meas, batch, floor = num(r.get("measured_tok_per_s")), num(r.get("batch")), num(d.get("floor_s"))
    if not (flops and nbytes and meas and batch and floor):
        return None
    achieved = flops * meas / batch  # decode steps per second (prefill time counted against it) x FLOPs per step
    frac = num(r.get("decode_only_fraction"))
    return {"label": label, "ai": flops / nbytes, "achieved": achieved, "attainable": flops / floor, "color": color,
            "shape": shape, "sub": f"{frac * 100:.1f}% of the roof (#{seq})" if frac is not None else f"#{seq}",
            "tip": f"{label}: {flops / nbytes:.3g} FLOP/B, {si(achieved, 'FLOP/s')} (ledger #{seq})"}


def _decode_row(r: dict[str, Any]) -> list[str]:
    d, p = r.get("decode_step") or {}, r.get("prefill") or {}
    ai_d = (num(d.get("flops")) or 0) / (num(d.get("bytes")) or 1)
    ai_p = (num(p.get("flops")) or 0) / (num(p.get("bytes")) or 1)
    return [number(r.get("measured_tok_per_s")), number(r.get("ceiling_tok_per_s"), ",.0f"),
            f"{(num(r.get('fraction')) or 0) * 100:.1f}% / {(num(r.get('decode_only_fraction')) or 0) * 100:.1f}%",
            ratio_x(r.get("headroom"), 2), f"{ai_d:.3g} {esc(d.get('bound'))} / {ai_p:.3g} {esc(p.get('bound'))}"]


def decode_roofline(b: dict[str, Any]) -> str:
    """The Roofline section of an LLM session: one decode step (tok/s)."""
    rf = b.get("roofline")
    if not rf:
        return _absent("The ledger has no roofline entry: this session measured no device ceilings (sessions from before "
                       "the roofline existed have none).")
    return roofline_body(
        rf, absent="No roofline: the ceilings were not measured or the cost model was not applied. The synthetic adapter "
        "has no model to cost, so its sessions record an empty roofline entry; otherwise PRELUDE could not measure this "
        "device's ceilings", workload="", point=_decode_point, chart_title=None,
        caption="Log-log roofline of one decode step (the phase that dominates a generation): the roof is min(bandwidth x "
        "intensity, matmul rate) from the measured ceilings. A filled marker is the achieved rate, (measured output tok/s / "
        "batch) x FLOPs per step, so prefill time counts against it; the hollow marker above it is the roof at that "
        "intensity. ",
        columns=[("measured tok/s", True), ("ceiling tok/s", True), ("fraction: run / decode only", True),
                 ("headroom", True), ("FLOP/B: decode / prefill (bound)", True)],
        row=_decode_row,
        no_final=("nothing was kept, so the final stack is stock" if not (b.get("final") or {}).get("ledger_seq")
                  else "the ledger has no roofline for the final stack"))
