"""The report's list of timed runs during which a server JIT-compiled a kernel (its own log said so:
``workloads/server_jit.py``), from the ledger's measurement records. Absent (no key, no lines) when no run
has any: an older session's breakdown and report stay as they were."""

from __future__ import annotations

from typing import Any

from inferloom.report.fmt import changes_text

__all__ = ["jit_runs", "jit_lines"]


def jit_runs(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per timed run with ``extra['server_jit']``: its measurement (trial or action), pair, arm."""
    rows = []
    for m in entries:
        if m.get("kind") != "measurement":
            continue
        for p in (m.get("protocol") or {}).get("pairs") or []:
            for arm, key in (("base", "a"), ("candidate", "b")):
                kernels = ((p.get(key) or {}).get("extra") or {}).get("server_jit")
                if kernels:
                    rows.append({"ledger_seq": m.get("seq"), "trial": m.get("trial"), "action": m.get("action"),
                                 "changes": m.get("changes"), "pair": p.get("index"), "arm": arm,
                                 "value": p.get("value_a" if key == "a" else "value_b"), "kernels": list(kernels)})
    return rows


def jit_lines(rows: list[dict[str, Any]] | None) -> list[str]:
    if not rows:
        return []
    lines = ["", "## Timed runs during which a server JIT-compiled", "",
             "Each run below paid for a kernel compile its server's log reported during the timed requests "
             "(vLLM's JIT monitor); its pair stays in the decision, and its value includes the compile."]
    for r in rows:
        what = (f"trial {r['trial']} `{changes_text(r['changes'])}`" if r.get("trial") is not None
                else str(r.get("action")))
        val = "failed" if r.get("value") is None else f"{r['value']:,.1f}"
        lines.append(f"- {what}, pair {int(r['pair']) + 1}, {r['arm']} run ({val}): "
                     f"{', '.join(r['kernels'])} (ledger #{r['ledger_seq']})")
    return lines
