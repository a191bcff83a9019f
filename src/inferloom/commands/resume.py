"""``inferloom resume``: continue a session after a crash, a kill or a stop, and print its report."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from inferloom.commands.common import print_session, progress_printer
from inferloom.phases.runner import resume
from inferloom.report.breakdown import stock_never_ran
from inferloom.session.ledger import read_entries

__all__ = ["run"]


def run(args: argparse.Namespace, console: Any, err: Any) -> int:
    kw: dict[str, Any] = {}
    if args.no_kb:
        kw["kb_url"] = None
    elif args.kb:  # the KB URL again (state.json keeps it without its password)
        kw["kb_url"] = args.kb
    resume(args.dir, progress=progress_printer(args, err), **kw)
    print_session(Path(args.dir), console)
    return 1 if stock_never_ran(read_entries(args.dir)) else 0  # exit 1: stock never ran (the report says why)
