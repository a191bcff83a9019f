"""The report's platform section, from the ledger alone: the PRELUDE and CLOSE platform audits (a stable
setting that changed between them is flagged) and the energy per output token of the timed runs beside
their throughput: the CLOSE comparison's (stock and the final stack), and a table of every measurement's
(each trial, stock's A/A, the final comparison, the sweep), from each run's raw record: ``gpu_energy_j``
(NVML) and ``cpu_energy_j`` (RAPL), only where they were readable; otherwise the section says why each
was skipped."""

from __future__ import annotations

from typing import Any, Iterator

from inferloom.report.fmt import changes_text

__all__ = ["platform_breakdown", "platform_lines", "measurement_energy", "run_extras"]


_SOURCES = (("gpu", "gpu_energy_j", "energy_method"), ("cpu", "cpu_energy_j", "cpu_energy_method"))


def _arm(runs: list[dict[str, Any]], key: str, method: str) -> dict[str, Any] | None:
    """Energy of one arm's successful timed runs that carry ``key`` (joules); None when none do."""
    metered = [r for r in runs if isinstance((r.get("extra") or {}).get(key), (int, float))]
    if not metered:
        return None
    joules = sum(r["extra"][key] for r in metered)
    tokens = sum(r.get("output_tokens") or 0 for r in metered)
    wall = sum(r.get("wall_s") or 0.0 for r in metered)
    return {"runs": len(metered), "energy_j": joules, "output_tokens": tokens,
            "j_per_output_token": joules / tokens if tokens else None, "j_per_run": joules / len(metered),
            "output_tokens_per_s": tokens / wall if wall else None, "mean_power_w": joules / wall if wall else None,
            "method": metered[0]["extra"].get(method)}


def measurement_energy(m: dict[str, Any], names: tuple[str, str] = ("base", "candidate"),
                       source: str = "gpu") -> dict[str, Any] | None:
    """One measurement's energy per arm (``source``: ``gpu`` NVML or ``cpu`` RAPL), from its raw run records;
    None when an arm has no reading."""
    if not m or not m.get("protocol"):
        return None
    _, key, method = next(x for x in _SOURCES if x[0] == source)
    out: dict[str, Any] = {"ledger_seq": m["seq"], "source": source}
    for arm, name in zip(("a", "b"), names):
        runs = [p[arm] for p in m["protocol"].get("pairs") or [] if (p.get(arm) or {}).get("success")]
        e = _arm(runs, key, method)
        if e is None:
            return None
        out[name] = e
    return out


def _energy(final: dict[str, Any] | None) -> dict[str, Any] | None:
    e = measurement_energy(final or {}, ("stock", "final"))
    if e is not None:
        e.pop("source")
    return e


def _trials(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every measurement's energy (trials, stock's A/A, the final comparison, sweep points), GPU and CPU."""
    out = []
    for m in entries:
        if m["kind"] != "measurement":
            continue
        for source, _, _ in _SOURCES:
            e = measurement_energy(m, source=source)
            if e is None:
                continue
            b, c = e["base"].get("j_per_output_token"), e["candidate"].get("j_per_output_token")
            out.append({**e, "action": m.get("action"), "trial": m.get("trial"), "changes": m.get("changes"),
                        "energy_ratio": c / b if b and c is not None else None})
    return out


def run_extras(entries: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The ``extra`` of each measurement pair's first run (arm a), in ledger order ({} where it has none)."""
    for m in entries:
        if m["kind"] == "measurement":
            for p in (m.get("protocol") or {}).get("pairs") or []:
                yield (p.get("a") or {}).get("extra") or {}


def _per(entries: list[dict[str, Any]]) -> str:
    """What one "output token" of a run record counts: an image for image workloads (their run records
    count images in ``output_tokens``), else a token."""
    for extra in run_extras(entries):
        if str(extra.get("unit") or (extra.get("objective") or {}).get("unit") or "").startswith("image"):
            return "image"
    return "output token"


def platform_breakdown(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The section's data, or None for a ledger without platform audits (an older session)."""
    audits = [e for e in entries if e["kind"] == "platform_audit"]
    if not audits:
        return None
    by = {e.get("at_phase"): e for e in audits}
    first = (by.get("PRELUDE") or audits[0]).get("audit") or {}
    gpu = first.get("gpu") or {}
    final = next((e for e in entries if e["kind"] == "measurement" and e.get("action") == "final_compare"), None)
    energy = _energy(final)
    close = by.get("CLOSE")
    out: dict[str, Any] = {
        "audit_seqs": {k: e["seq"] for k, e in by.items()}, "cpu": first.get("cpu"),
        "gpu_available": bool(gpu.get("available")), "gpus": gpu.get("gpus") or [],
        "changes": (close or {}).get("changes") or [], "energy": energy, "energy_by_measurement": _trials(entries),
        "per": _per(entries)}
    if energy is None:
        out["energy_skipped"] = (gpu.get("why") or "no GPU energy was metered") if not gpu.get("available") else (
            "no final comparison was measured" if final is None else "the timed runs carry no energy readings")
    counters = (first.get("cpu") or {}).get("energy_counters") or {}
    if counters and not counters.get("available"):
        out["cpu_energy_skipped"] = counters.get("why")
    return out


def platform_lines(p: dict[str, Any] | None) -> list[str]:
    if not p:
        return []
    seqs = ", ".join(f"{k} #{v}" for k, v in p["audit_seqs"].items())
    cpu = p.get("cpu") or {}
    lines = ["", "## Platform", "",
             f"- CPU: governor {cpu.get('governors')}, boost {cpu.get('boost')}, SMT {cpu.get('smt_control')}, "
             f"NUMA nodes {cpu.get('numa_nodes')}, memory {cpu.get('mem_total_kb')} kB (audits: ledger {seqs})."]
    for g in p.get("gpus") or []:
        lines.append(f"- GPU {g['index']} {g.get('name')}: clocks max {g.get('clocks_max_mhz')}, application "
                     f"{g.get('clocks_application_mhz')} MHz; ECC {g.get('ecc_mode')}, persistence "
                     f"{g.get('persistence_mode')}, power limit {g.get('power_limit_w')} W, {g.get('temperature_c')} C.")
    if not p.get("gpu_available"):
        lines.append(f"- GPU audit skipped: {p.get('energy_skipped')}.")
    if p.get("changes"):
        for c in p["changes"]:
            lines.append(f"- **Changed between PRELUDE and CLOSE: {c['what']}: {c['before']} -> {c['after']}** "
                         "(the measurements straddle it; treat the comparison with care)")
    else:
        lines.append("- No platform setting changed between PRELUDE and CLOSE." if "CLOSE" in p["audit_seqs"]
                     else "- No CLOSE audit yet.")
    e = p.get("energy")
    if e:
        for arm in ("stock", "final"):
            a = e[arm]
            jpt = f"{a['j_per_output_token']:.4f} J" if a.get("j_per_output_token") is not None else "n/a"
            per = p.get("per") or "output token"
            rate = "images/s" if per == "image" else "output tok/s"
            lines.append(f"- Energy, {arm}: {jpt} per {per} at {_rate(a['output_tokens_per_s'])} {rate}, "
                         f"mean {a['mean_power_w']:.0f} W over {a['runs']} timed runs ({a['method']}; ledger #{e['ledger_seq']}).")
    else:
        lines.append(f"- Energy per {p.get('per') or 'output token'}: not measured ({p.get('energy_skipped')}).")
    if p.get("cpu_energy_skipped"):
        lines.append(f"- CPU energy: not measured ({p['cpu_energy_skipped']}).")
    rows = p.get("energy_by_measurement") or []
    if rows:
        u, r_ = ("image", "images/s") if p.get("per") == "image" else ("token", "tok/s")
        lines += ["", f"| measurement | energy | base J/{u} | base {r_} | candidate J/{u} | candidate {r_} | "
                  f"candidate/base J/{u} | ledger |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            what = (f"trial {r['trial']} `{changes_text(r['changes'])}`" if r.get("trial") is not None
                    else str(r.get("action")))
            b, c = r["base"], r["candidate"]
            lines.append(f"| {what} | {r['source']} | {_f(b.get('j_per_output_token'), '.4f')} | "
                         f"{_f(b.get('output_tokens_per_s'), ',.1f')} | {_f(c.get('j_per_output_token'), '.4f')} | "
                         f"{_f(c.get('output_tokens_per_s'), ',.1f')} | {_f(r.get('energy_ratio'), '.3f')} | "
                         f"#{r['ledger_seq']} |")
    return lines


def _rate(v: Any) -> str:
    return "n/a" if v is None else format(v, ",.1f" if v >= 10 else ".3f")


def _f(v: Any, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)
