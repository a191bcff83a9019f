"""The patch pipeline's part of ``session_breakdown.json`` and ``report.md``:
pure functions of the ledger, like the rest of the breakdown."""

from __future__ import annotations

from typing import Any

__all__ = ["patch_breakdown", "patch_report_lines"]


def _unit(entries: list[dict[str, Any]]) -> str | None:
    for e in entries:
        if e["kind"] == "measurement":
            for p in (e.get("protocol") or {}).get("pairs", []):
                obj = ((p.get("a") or {}).get("extra") or {}).get("objective")
                if isinstance(obj, dict):
                    return str(obj.get("unit") or "")
    return None


def patch_breakdown(entries: list[dict[str, Any]]) -> dict[str, Any]:
    patches = [e for e in entries if e["kind"] == "patch"]
    drill = next((e for e in reversed(entries) if e["kind"] == "rollback_drill"), None)
    if not patches and drill is None:
        return {}
    out: dict[str, Any] = {"objective_unit": _unit(entries), "patches": [
        {k: e.get(k) for k in ("id", "title", "gate", "outcome", "rule", "why", "kept", "commit", "ratio", "ci_low",
                               "ci_high", "quality_failed", "measurement_seq")} | {"ledger_seq": e["seq"]}
        for e in patches]}
    if drill is not None:
        out["rollback_drill"] = {k: drill.get(k) for k in ("passed", "why", "reverted", "tree_identical", "ratio",
                                                           "ci_low", "ci_high", "n_pairs", "tolerance", "band",
                                                           "measurement_seq")} | {"ledger_seq": drill["seq"]}
    return out


def _pct(r: Any) -> str:
    return "n/a" if r is None else f"{(r - 1) * 100:+.1f}%"


def patch_report_lines(b: dict[str, Any]) -> list[str]:
    if "patches" not in b and "rollback_drill" not in b:
        return []
    lines = ["", "## Source patches (custom workload)", ""]
    if b.get("objective_unit") is not None:
        lines.append(f"- Objective unit (from the entrypoint's results): {b['objective_unit'] or '(none given)'}.")
    for p in b.get("patches", []):
        if p.get("kept"):
            lines.append(f"- `{p['id']}` ({p['title']}): **kept** as commit {str(p.get('commit'))[:10]}, "
                         f"{_pct(p.get('ratio'))} [{_pct(p.get('ci_low'))}, {_pct(p.get('ci_high'))}] (ledger #{p['ledger_seq']})")
        elif p.get("gate") == "measure":
            why = "; ".join(p.get("quality_failed") or []) or p.get("outcome")
            lines.append(f"- `{p['id']}` ({p['title']}): rejected after measurement"
                         + (f" by rule **{p['rule']}**" if p.get("rule") else f" ({p.get('outcome')})")
                         + f", {_pct(p.get('ratio'))} [{_pct(p.get('ci_low'))}, {_pct(p.get('ci_high'))}]: {why} "
                         f"(ledger #{p['ledger_seq']})")
        else:
            lines.append(f"- `{p['id']}` ({p['title']}): refused at gate {p.get('gate')} by rule **{p.get('rule')}**: "
                         f"{p.get('why')} (ledger #{p['ledger_seq']})")
    d = b.get("rollback_drill")
    if d:
        lines.append(f"- Rollback drill: **{'passed' if d.get('passed') else 'FAILED'}**: {d.get('why')}; reverted "
                     f"{len(d.get('reverted') or [])} commit(s), tree identical to stock: {d.get('tree_identical')}, "
                     f"rolled-back vs stock {_pct(d.get('ratio'))} [{_pct(d.get('ci_low'))}, {_pct(d.get('ci_high'))}], "
                     + (f"stock's own band [{_pct(d['band'][0])}, {_pct(d['band'][1])}] " if d.get("band") else "")
                     + f"(ledger #{d['ledger_seq']})")
    return lines
