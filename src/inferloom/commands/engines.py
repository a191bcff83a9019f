"""``inferloom engines SESSION_DIR SESSION_DIR --out DIR [--max-pairs N]``: which serving engine to deploy for one
workload (:mod:`inferloom.engine_choice`). The sessions are read and checked, and ``--out`` too, before anything
runs: two sessions that are not one workload on one machine and day, or not closed, are one line, exit 2, nothing
written. Measuring runs what the sessions' files name (their servers, written kernels, engine overlays), so, as
``verify --remeasure``, it first says what that is and runs it only with ``--trust-session`` (exit 1 without it,
nothing written; docs/security.md). The measurement failing is exit 1 (engines.md says why); a decision, either way,
is exit 0."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from inferloom.commands.common import UsageError, output_dir, progress_printer
from inferloom.engine_choice import choose_engine, read_comparable
from inferloom.evidence.trust import TRUST_FLAG, plan_lines

__all__ = ["run", "OWN_FILES"]

#: what a run writes into --out: a directory already holding one of them holds an earlier choice
OWN_FILES = ("engines.md", "engines.json", "engines_pairs.jsonl")


def run(args: argparse.Namespace, console: Any, err: Any) -> int:
    sessions = read_comparable(args.sessions)
    out = Path(args.out) if args.out else Path("runs") / time.strftime("engines-%Y%m%d-%H%M%S")
    output_dir(out, "--out")
    held = [f for f in OWN_FILES if (out / f).exists()]
    if held:
        raise UsageError(f"--out {out}: already holds {', '.join(held)} of an earlier engine choice; choose a new or "
                         "empty directory (nothing was written)")
    if not args.trust_session:  # the sessions' authors' code: said first, run only when the user says so
        for s in sessions:
            for line in plan_lines(s.directory, stock_ok=True):
                console.print(line, highlight=False, markup=False, soft_wrap=True)
        console.print(f"not measured: add {TRUST_FLAG} once you have read what it runs (docs/security.md)",
                      highlight=False, markup=False, soft_wrap=True)
        return 1
    res = choose_engine(sessions, out, max_pairs=args.max_pairs, progress=progress_printer(args, err))
    rec = res["recommendation"]
    console.print(rec["headline"], highlight=False, markup=False, soft_wrap=True)
    for r in rec["reasons"]:
        console.print(f"  - {r}", highlight=False, markup=False, soft_wrap=True)
    console.print(f"written: {', '.join(res['files'])}", highlight=False, markup=False, soft_wrap=True)
    return 1 if res["decision"]["outcome"] == "failed" else 0
