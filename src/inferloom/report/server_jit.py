"""The report's list of timed runs during which a server JIT-compiled a kernel (its own log said so:
``workloads/server_jit.py``), from the ledger's measurement records. Absent (no key, no lines) when no run
has any: an older session's breakdown and report stay as they were. A measurement written since the protocol
measures such a pair again (its result has a ``remeasured`` list: ``measure/protocol.py``'s contract) says,
per run, whether its pair was measured again (not in the decision) or counted (the re-measures used); one
written before has no such key, and its rows and lines are what they were."""

from __future__ import annotations

from typing import Any

from inferloom.report.fmt import changes_text

__all__ = ["jit_runs", "jit_lines"]


def _attempts(proto: dict[str, Any]) -> list[dict[str, Any]]:
    """The measurement's pairs, and (written since) the ones measured again, each slot's in the order run."""
    pairs = list(proto.get("pairs") or [])
    if "remeasured" not in proto:
        return pairs
    again = [{**p, "_again": True} for p in proto.get("remeasured") or []]
    return sorted(pairs + again, key=lambda p: (p.get("index") or 0, 0 if p.get("_again") else 1,
                                               p.get("remeasure") or 0))


def jit_runs(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per timed run with ``extra['server_jit']``: its measurement (trial or action), pair, arm; since
    the protocol measures such pairs again, also ``measured_again`` and the bound ``jit_remeasures``."""
    rows = []
    for m in entries:
        if m.get("kind") != "measurement":
            continue
        proto = m.get("protocol") or {}
        bound = (proto.get("settings") or {}).get("jit_remeasures", 0)
        for p in _attempts(proto):
            for arm, key in (("base", "a"), ("candidate", "b")):
                kernels = ((p.get(key) or {}).get("extra") or {}).get("server_jit")
                if kernels:
                    row = {"ledger_seq": m.get("seq"), "trial": m.get("trial"), "action": m.get("action"),
                           "changes": m.get("changes"), "pair": p.get("index"), "arm": arm,
                           "value": p.get("value_a" if key == "a" else "value_b"), "kernels": list(kernels)}
                    if "remeasured" in proto:  # only then: an older breakdown keeps exactly its rows
                        row.update(measured_again=bool(p.get("_again")), remeasure=p.get("remeasure"),
                                   jit_remeasures=bound)
                    rows.append(row)
    return rows


def _fate(r: dict[str, Any], old: bool) -> str:
    if "measured_again" not in r:  # written before the protocol measured such pairs again
        return "" if old else ": counted in the decision (measured before such pairs were measured again)"
    n = r.get("jit_remeasures") or 0
    if r["measured_again"]:
        return f": measured again, not in the decision (re-measure {r.get('remeasure')} of {n})"
    return (f": counted in the decision (the {n} re-measure{'s were' if n != 1 else ' was'} used)" if n
            else ": counted in the decision (protocol.jit_remeasures 0)")


def jit_lines(rows: list[dict[str, Any]] | None) -> list[str]:
    if not rows:
        return []
    old = all("measured_again" not in r for r in rows)  # an older session: its lines as they were
    said = ("its pair stays in the decision, and its value includes the compile." if old
            else "a compile is warm-up, so its pair was measured again on fresh prompts and left out of the "
            "decision, up to `protocol.jit_remeasures` pairs per measurement; after those, the compile recurs "
            "and its pair counts, its value with the compile in it.")
    lines = ["", "## Timed runs during which a server JIT-compiled", "",
             "Each run below paid for a kernel compile its server's log reported during the timed requests "
             f"(vLLM's JIT monitor); {said}"]
    for r in rows:
        what = (f"trial {r['trial']} `{changes_text(r['changes'])}`" if r.get("trial") is not None
                else str(r.get("action")))
        val = "failed" if r.get("value") is None else f"{r['value']:,.1f}"
        lines.append(f"- {what}, pair {int(r['pair']) + 1}, {r['arm']} run ({val}): "
                     f"{', '.join(r['kernels'])} (ledger #{r['ledger_seq']}){_fate(r, old)}")
    return lines
