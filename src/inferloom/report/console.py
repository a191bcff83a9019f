"""The console tables (rich) of ``inferloom bench`` and ``inferloom knobs``.
Pure formatting, no measuring."""

from __future__ import annotations

import statistics
from typing import Any

from rich.console import Console
from rich.table import Table

from inferloom.report.fmt import changes_text, pct_2dp
from inferloom.spec import objective_label

__all__ = ["print_bench", "print_knobs"]


def print_bench(res: dict[str, Any], console: Console, out_path: str | None = None) -> None:
    """The pairs of a bench or A/A result, then its decision, quality and timings."""
    aa = res["kind"] == "aa"
    b_label = "stock-2" if aa else "candidate"
    prot = res.get("protocol", {})
    unit = objective_label(res.get("spec") or {})
    t = Table(title="A/A noise measurement (stock vs stock)" if aa else "stock vs candidate, interleaved pairs")
    for col in ("pair", "order", "seed", f"stock {unit}", f"{b_label} {unit}", "ratio"):
        t.add_column(col, justify="right")
    for p in prot.get("pairs", []):
        va, vb = p.get("value_a"), p.get("value_b")
        t.add_row(
            str(p["index"] + 1), p["order"], str(p["seed"]),
            f"{va:,.1f}" if va is not None else "failed",
            f"{vb:,.1f}" if vb is not None else "failed",
            f"{vb / va:.4f}" if va and vb else "-",
        )
    console.print(t)

    d = prot.get("decision") or {}
    s = Table(show_header=False, title="result")
    s.add_column("what", style="bold")
    s.add_column("value")
    changed = {k: v for k, v in res["candidate_config"].items() if res["stock_config"].get(k) != v}
    img, tr = res["spec"].get("diffusion"), res["spec"]["traffic"]
    shape = (f"{img['width']}x{img['height']}, {img['steps']} steps, batch {img['batch_size']}" if img else
             f"trace {tr['trace']} at x{tr.get('trace_speed', 1.0):g}" if tr.get("trace") else
             f"concurrency {tr['concurrency']}, {tr['input_len']} in / {tr['output_len']} out")
    s.add_row("workload", f"{res['spec']['model']} on {res['adapter'].get('device', '?')}, {res['spec']['dtype']}, {shape}")
    if not aa:
        s.add_row("candidate", changes_text(changed))
    va = [p["value_a"] for p in prot.get("pairs", []) if p.get("value_a") is not None]
    vb = [p["value_b"] for p in prot.get("pairs", []) if p.get("value_b") is not None]
    if va and vb:
        s.add_row(f"median {unit}", f"stock {statistics.median(va):,.1f}  |  {b_label} {statistics.median(vb):,.1f}")
    if d:
        s.add_row(f"ratio {b_label}/stock", f"{d['ratio']:.4f} ({pct_2dp(d['ratio'])})")
        s.add_row(f"{d.get('confidence', 0.95) * 100:.0f}% interval",
                  f"[{d['ci_low']:.4f}, {d['ci_high']:.4f}]  ({pct_2dp(d['ci_low'])} .. {pct_2dp(d['ci_high'])}); "
                  f"per-look confidence {d.get('confidence_per_look', float('nan')):.4f}, "
                  + ("harm stop: the range of the pair ratios, no interval" if d.get("stop") == "harm" else
                     f"{d.get('method')}, budget {d.get('budget')} pairs" if d.get("design") == "sequential"
                     else f"{d.get('method', '?')} bootstrap, seed {d.get('bootstrap_seed')}"))
        if d.get("reason"):
            s.add_row("why it stopped", str(d["reason"]))
        s.add_row("pairs", f"{d['n_pairs']} (min gain to keep {d.get('min_gain', 0) * 100:.1f}%)")
    sb = res.get("slo_binding")
    if sb:
        s.add_row("SLOs", sb.get("note") or f"{sb['missed_slo']} of {sb['completed']} requests missed an SLO "
                  f"({(sb.get('missed_fraction') or 0) * 100:.1f}%)")
    s.add_row("protocol verdict", prot.get("verdict", "-") + (f": {res.get('error')}" if res.get("error") else ""))
    if aa and res.get("noise"):
        n = res["noise"]
        s.add_row("noise floor", ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in n.items()))
    q = res.get("quality", {})
    if q.get("evaluated") and q.get("kind") == "quality_gate":  # a custom workload's own gate
        s.add_row("quality gate", "PASS" if q["passed"] else f"FAIL: {'; '.join(q.get('failed') or [])}")
    elif q.get("evaluated"):
        for qs in q.get("sets", []):
            v = qs["values"]
            shown = (f"  worst image: PSNR {v['min_psnr_db']:.1f} dB, SSIM {v['min_ssim']:.4f}, latent err "
                     f"{v['max_latent_rel_err']:.3g}" if "min_psnr_db" in v else  # images
                     f"  top1 {v['top1_agreement']:.4f}, KL {v['mean_kl']:.3g}, greedy {v['greedy_agreement']:.3f}")
            s.add_row(
                f"quality ({qs['set_name']})",
                ("PASS" if qs["passed"] else f"FAIL: {qs['message']}") + shown
                + (f", task {v['task_accuracy']:.3f} vs stock {v['task_accuracy_stock']:.3f} (drop <= "
                   f"{v['task_drop_upper']:.4f})" if "task_accuracy" in v else ""),
            )
        if isinstance(q.get("tolerance"), dict):
            s.add_row("quality tolerance", f"{q['tolerance'].get('name')}: {q['tolerance'].get('why')}")
    else:
        s.add_row("quality", "not evaluated")
    tm = res.get("timings", {})
    for k, label in (("compile_overhead_stock_s", "compile/warm-up overhead, stock"),
                     ("compile_overhead_candidate_s", f"compile/warm-up overhead, {b_label}")):
        if tm.get(k) is not None:
            s.add_row(label, f"{tm[k]:.2f} s (first warm-up run minus the median timed run)")
    s.add_row("verdict", f"[bold]{res.get('verdict', '-')}[/bold]")
    if out_path:
        s.add_row("result JSON", out_path)
    console.print(s)


def print_knobs(adapter_desc: dict[str, Any], knobs: list[Any], console: Console) -> None:
    """An adapter's knob space, one row per knob."""
    t = Table(title=f"knob space of {adapter_desc.get('framework', '?')} on {adapter_desc.get('device', '?')}")
    for col in ("knob", "stock", "domain", "applies to", "changes numerics", "what it does"):
        t.add_column(col)
    for k in knobs:
        t.add_row(k.name, str(k.default), k.domain_text(), ",".join(sorted(k.applies_to)),
                  "yes" if k.changes_numerics else "no", k.description)
    console.print(t)
    flags = adapter_desc.get("server_flags")
    if isinstance(flags, dict):  # a server adapter: its knobs are those the installed server has
        if flags.get("flags") is None:
            console.print(f"server flags unknown ({flags.get('error')}): the static knob table above")
        else:
            console.print(f"{flags.get('count')} server flags read from `{flags.get('source')}` "
                          f"({flags.get('server_version')})")
        for name, why in {**(flags.get("dropped_knobs") or {}), **(flags.get("knob_notes") or {})}.items():
            console.print(f"  knob {name}: {why}", markup=False)
