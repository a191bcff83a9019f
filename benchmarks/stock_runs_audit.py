"""Which trials of published vLLM sessions started the same server as stock: each trial's changes against what
the stock server's own log says it runs (workloads/server_says.py), read from the session's ledger and server logs.

    .venv/bin/python benchmarks/stock_runs_audit.py SESSION_DIR [SESSION_DIR ...] [--stock-log LOG]

``--stock-log``: a stock server log of the same vLLM version, device and model shape, for sessions published
without their server logs (say so where the table is quoted). Prints a markdown table, one row per trial.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from inferloom.agents.search_view import redundant
from inferloom.session import ledger as L
from inferloom.workloads.server_says import knob_values
from inferloom.workloads.vllm_knobs import vllm_knobs
from inferloom.workloads.vllm_startup import says


def stock_log(session: Path, ledger: list[dict]) -> Path | None:
    """The log of the session's first server (PRELUDE's stock), if it was published."""
    for e in ledger:
        if e["kind"] == L.SERVER_START and e.get("log"):
            p = session / "servers" / e["log"]
            return p if p.is_file() else None
    return None


def audit(session: Path, fallback: Path | None) -> list[str]:
    state = json.loads((session / "state.json").read_text())
    spec = json.loads((session / "manifest.json").read_text())["spec"]
    knobs = vllm_knobs(int(spec["traffic"]["concurrency"]))
    ledger = L.read_entries(session)
    stock = {k.name: state["stock_config"].get(k.name, k.default) for k in knobs}
    log = stock_log(session, ledger) or fallback
    if log is None:
        return [f"| {session.relative_to(session.parents[1])} | - | - | no stock server log |"]
    runs = {k: v["value"] for k, v in knob_values(says(log.read_text(errors="replace")), knobs).items()}
    rows, stack = [], dict(stock)
    for i, t in enumerate(state["trials"], 1):
        ch = dict(t.get("changes") or {})
        same = redundant(ch, stack, stock, runs)
        verdict = t.get("verdict")
        rows.append(f"| {session.relative_to(session.parents[1])} | {i} `{ch}` | {verdict} | "
                    + (f"**the same server as stock** ({', '.join(same)}: stock's log, {log.name})"
                       if same and len(same) == len(ch) else "a real change") + " |")
        if t.get("kept"):
            stack.update(ch)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sessions", nargs="+", type=Path)
    ap.add_argument("--stock-log", type=Path, help="a stock log for sessions published without their server logs")
    a = ap.parse_args()
    print("| session | trial | verdict | what the stock server's log says |\n| --- | --- | --- | --- |")
    for s in a.sessions:
        print("\n".join(audit(s.resolve(), a.stock_log)))


if __name__ == "__main__":
    main()
