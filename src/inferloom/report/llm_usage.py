"""The LLM agents' part of the breakdown and of ``report.md``: calls, tokens,
latency and cost (from the declared prices) summed over the ledger's agent
entries, per role, the cost per kept gain (cost over the final stack's
measured gain over stock, in percent) and the refusals of the LLM agents'
outputs (agents named ``llm-*``) by rule. Empty for a session without an LLM."""

from __future__ import annotations

from typing import Any

from inferloom.session import ledger as L

__all__ = ["llm_breakdown", "llm_report_lines"]


def llm_breakdown(entries: list[dict[str, Any]], final_ratio: float | None) -> dict[str, Any]:
    """``{"llm": {...}}`` when some agent entry carries ``llm_calls``, else {}."""
    calls, seqs = [], []
    by_rule: dict[str, dict[str, Any]] = {}
    for e in entries:
        if e.get("kind") == L.REFUSAL and str(e.get("agent") or "").startswith("llm-"):
            r = by_rule.setdefault(str(e.get("rule")), {"count": 0, "agents": [], "ledger_seqs": []})
            r["count"] += 1
            r["ledger_seqs"].append(e["seq"])
            if e["agent"] not in r["agents"]:
                r["agents"].append(e["agent"])
    for e in entries:
        if e.get("kind") == L.AGENT_IO and isinstance(e.get("output"), dict) and e["output"].get("llm_calls"):
            calls += [c for c in e["output"]["llm_calls"] if isinstance(c, dict)]
            seqs.append(e["seq"])
    if not calls:
        return {}
    roles: dict[str, dict[str, Any]] = {}
    for c in calls:
        r = roles.setdefault(str(c.get("role")), {"calls": 0, "input_tokens": 0, "output_tokens": 0, "errors": 0})
        r["calls"] += 1
        r["input_tokens"] += int(c.get("input_tokens") or 0)
        r["output_tokens"] += int(c.get("output_tokens") or 0)
        r["errors"] += 1 if c.get("error") else 0
    costs = [float(c["cost_usd"]) for c in calls if isinstance(c.get("cost_usd"), (int, float))]
    cost = sum(costs) if costs else None
    gain_pct = (final_ratio - 1.0) * 100 if isinstance(final_ratio, (int, float)) and final_ratio > 1.0 else None
    tokens = sum(r["input_tokens"] + r["output_tokens"] for r in roles.values())
    return {"llm": {"calls": len(calls), "tokens": tokens, "latency_s": sum(float(c.get("latency_s") or 0) for c in calls),
                    "cost_usd": cost, "by_role": roles, "kept_gain_pct": gain_pct,
                    "cost_usd_per_gain_pct": cost / gain_pct if cost is not None and gain_pct else None,
                    "tokens_per_gain_pct": tokens / gain_pct if gain_pct else None,
                    "errors": [{"rule": (c.get("error") or {}).get("rule"), "role": c.get("role")}
                               for c in calls if c.get("error")],
                    "refusals_by_rule": by_rule, "ledger_seqs": seqs}}


def llm_report_lines(b: dict[str, Any]) -> list[str]:
    """The ``## LLM agents`` section of ``report.md``; [] without one."""
    m = b.get("llm")
    if not m:
        return []
    cost = "not priced (set agents.llm.usd_per_mtok_input/output)" if m["cost_usd"] is None else f"${m['cost_usd']:.4f}"
    lines = ["", "## LLM agents", "",
             f"- {m['calls']} calls, {m['tokens']:,} tokens, {m['latency_s']:.1f} s waiting, cost {cost} "
             f"(ledger #{m['ledger_seqs'][0]}..#{m['ledger_seqs'][-1]}).",
             *(f"- {role}: {r['calls']} calls, {r['input_tokens']:,} in / {r['output_tokens']:,} out tokens, "
               f"{r['errors']} refused" for role, r in sorted(m["by_role"].items()))]
    if m["kept_gain_pct"] is None:
        lines.append("- Cost per kept gain: n/a (the final stack is not faster than stock).")
    else:
        per = "" if m["cost_usd_per_gain_pct"] is None else f"${m['cost_usd_per_gain_pct']:.4f} and "
        lines.append(f"- Cost per kept gain: {per}{m['tokens_per_gain_pct']:,.0f} tokens per +1% "
                     f"(final stack +{m['kept_gain_pct']:.1f}% over stock).")
    rules = m.get("refusals_by_rule") or {}
    lines.append("- Refusals of the LLM agents' outputs by rule: " + (", ".join(
        f"{rule} x{v['count']} ({', '.join(v['agents'])}; ledger {', '.join('#' + str(s) for s in v['ledger_seqs'])})"
        for rule, v in sorted(rules.items())) if rules else "none") + ".")
    return lines
