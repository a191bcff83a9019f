"""``inferloom optimize``: start an optimization session and print its report."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from inferloom.commands.common import output_dir, print_session, progress_printer, spec_from_args
from inferloom.phases.runner import start

__all__ = ["run"]


def run(args: argparse.Namespace, console: Any, err: Any) -> int:
    spec = spec_from_args(args)
    out = output_dir(args.out, "--out") if args.out else Path("runs") / f"session-{time.strftime('%Y%m%d-%H%M%S')}"
    progress = progress_printer(args, err)
    progress(f"session directory: {out}; budget {args.budget_minutes:g} min, {args.max_trials} trials; "
             f"`inferloom resume {out}` continues it if interrupted")
    kb_url = None if args.no_kb else (args.kb or "default")
    start(out, spec, budget_minutes=args.budget_minutes, max_trials=args.max_trials, progress=progress,
          cycle_ceiling=args.cycles, sweep=not args.no_sweep, kb_url=kb_url)
    print_session(out, console)
    return 0
