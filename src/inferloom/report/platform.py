"""The report's platform section, from the ledger alone: the PRELUDE and CLOSE platform audits (a stable
setting that changed between them is flagged) and the GPU energy per output token of the CLOSE comparison's
timed runs, beside their throughput (each run's ``gpu_energy_j`` in its raw record; only where NVML was
present: otherwise the section says why it was skipped)."""

from __future__ import annotations

from typing import Any

__all__ = ["platform_breakdown", "platform_lines"]


def _energy(final: dict[str, Any] | None) -> dict[str, Any] | None:
    if not final or not final.get("protocol"):
        return None
    out: dict[str, Any] = {"ledger_seq": final["seq"]}
    for arm in ("a", "b"):
        runs = [p[arm] for p in final["protocol"].get("pairs") or [] if (p.get(arm) or {}).get("success")]
        metered = [r for r in runs if isinstance((r.get("extra") or {}).get("gpu_energy_j"), (int, float))]
        if not metered:
            return None
        joules = sum(r["extra"]["gpu_energy_j"] for r in metered)
        tokens = sum(r.get("output_tokens") or 0 for r in metered)
        wall = sum(r.get("wall_s") or 0.0 for r in metered)
        out["stock" if arm == "a" else "final"] = {
            "runs": len(metered), "energy_j": joules, "output_tokens": tokens,
            "j_per_output_token": joules / tokens if tokens else None,
            "output_tokens_per_s": tokens / wall if wall else None, "mean_power_w": joules / wall if wall else None,
            "method": metered[0]["extra"].get("energy_method")}
    return out


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
        "changes": (close or {}).get("changes") or [], "energy": energy}
    if energy is None:
        out["energy_skipped"] = (gpu.get("why") or "no GPU energy was metered") if not gpu.get("available") else (
            "no final comparison was measured" if final is None else "the timed runs carry no energy readings")
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
            lines.append(f"- Energy, {arm}: {jpt} per output token at {a['output_tokens_per_s']:,.1f} output tok/s, "
                         f"mean {a['mean_power_w']:.0f} W over {a['runs']} timed runs ({a['method']}; ledger #{e['ledger_seq']}).")
    else:
        lines.append(f"- Energy per output token: not measured ({p.get('energy_skipped')}).")
    return lines
