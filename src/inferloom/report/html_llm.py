"""The HTML report's ``LLM agents`` section (:mod:`inferloom.report.html`):
calls, tokens, time waiting and cost per role, the cost per kept gain, and
the LLM agents' refusals by rule, each citing its ledger entries. None (no
section) for a session without an LLM."""

from __future__ import annotations

from typing import Any

from inferloom.report.fmt import esc
from inferloom.report.html_blocks import _cite, _table

__all__ = ["llm_section"]


def _usd(x: Any) -> str:
    return f"${x:.4f}" if isinstance(x, (int, float)) else "not priced"


def llm_section(b: dict[str, Any]) -> str | None:
    m = b.get("llm")
    if not m:
        return None
    cost = _usd(m.get("cost_usd"))
    out = [f'<dl class="kv"><dt>calls</dt><dd>{m["calls"]:,} {_cite(m.get("ledger_seqs"))}</dd>',
           f"<dt>tokens</dt><dd>{m['tokens']:,}</dd>",
           f"<dt>time waiting</dt><dd>{m['latency_s']:.1f} s</dd>",
           f"<dt>cost</dt><dd>{esc(cost)}"
           + ("" if m.get("cost_usd") is not None else " (set agents.llm.usd_per_mtok_input/output)") + "</dd>"]
    if m.get("kept_gain_pct") is None:
        out.append("<dt>cost per kept gain</dt><dd>n/a (the final stack is not faster than stock)</dd>")
    else:
        per = "" if m.get("cost_usd_per_gain_pct") is None else f"{_usd(m['cost_usd_per_gain_pct'])} and "
        out.append(f"<dt>cost per kept gain</dt><dd>{esc(per)}{m['tokens_per_gain_pct']:,.0f} tokens per +1% "
                   f"(final stack +{m['kept_gain_pct']:.1f}% over stock)</dd>")
    out.append("</dl>")
    roles = sorted((m.get("by_role") or {}).items())
    out.append(_table([("role", False), ("calls", True), ("input tokens", True), ("output tokens", True),
                       ("calls that failed", True)],
                      [[esc(r), f"{v['calls']:,}", f"{v['input_tokens']:,}", f"{v['output_tokens']:,}",
                        f"{v['errors']:,}"] for r, v in roles]))
    by_rule = m.get("refusals_by_rule") or {}
    if by_rule:
        out.append("<h3>Refusals of the LLM agents' outputs, by rule</h3>")
        out.append(_table([("rule", False), ("agents", False), ("count", True), ("ledger", False)],
                          [[f"<code>{esc(rule)}</code>", esc(", ".join(v["agents"])), f"{v['count']:,}",
                            _cite(v["ledger_seqs"])] for rule, v in sorted(by_rule.items())]))
    else:
        out.append('<p class="note">No output of an LLM agent was refused.</p>')
    out.append('<p class="note">An LLM never measures and never decides a keep: its outputs went through the same '
               "allowlists, gates and paired measurements as every other agent's.</p>")
    return "".join(out)
