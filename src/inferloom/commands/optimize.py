"""``inferloom optimize``: start an optimization session and print its report."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from inferloom.commands.common import UsageError, output_dir, print_session, progress_printer, spec_from_args
from inferloom.agents.llm_setup import check_llm
from inferloom.evidence.trust import TRUST_FLAG, replay_lines
from inferloom.phases.runner import recorded_llm_spec, start
from inferloom.preflight import check_runnable
from inferloom.report.breakdown import stock_never_ran
from inferloom.session.ledger import read_entries

__all__ = ["run"]


def run(args: argparse.Namespace, console: Any, err: Any) -> int:
    spec = spec_from_args(args)
    out = output_dir(args.out, "--out") if args.out else Path("runs") / f"session-{time.strftime('%Y%m%d-%H%M%S')}"
    check_runnable(spec)  # a configuration that can't work: one line, exit 2, nothing created or printed before
    replay = str(Path(args.llm_replay).absolute()) if args.llm_replay else None
    if args.trust_session and not replay:
        raise UsageError(f"{TRUST_FLAG}: only with --llm-replay (a replayed session's code runs here)")
    if spec.agents.llm is not None or replay:
        check_llm(spec.agents.llm or recorded_llm_spec(replay), replay)
    if replay and not args.trust_session and (plan := replay_lines(replay)):
        for line in plan:  # someone else's written kernels: said first, run only when the user says so
            console.print(line, highlight=False, markup=False)
        return 1
    progress = progress_printer(args, err)
    progress(f"session directory: {out}; budget {args.budget_minutes:g} min, {args.max_trials} trials; "
             f"`inferloom resume {out}` continues it if interrupted")
    kb_url = None if args.no_kb else (args.kb or "default")
    start(out, spec, budget_minutes=args.budget_minutes, max_trials=args.max_trials, progress=progress,
          cycle_ceiling=args.cycles, sweep=not args.no_sweep, kb_url=kb_url, llm_replay=replay)
    print_session(out, console)
    # stock never ran (its report's first line says why): the session failed, whatever else it wrote
    return 1 if stock_never_ran(read_entries(out)) else 0
