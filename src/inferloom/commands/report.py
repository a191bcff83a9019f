"""``inferloom report``: re-render a session's report (and optionally its HTML page) from the ledger alone.

``--out`` goes through :func:`~inferloom.commands.common.output_file` (the
session's own report.html may be rewritten in place); the re-render itself
refuses to replace a report computed from more ledger entries
(:func:`inferloom.report.artifacts.write_artifacts`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from inferloom.commands.common import UsageError, output_file, print_session
from inferloom.report import write_artifacts, write_html

__all__ = ["run"]


def run(args: argparse.Namespace, console: Any, err: Any) -> int:
    d = Path(args.dir)
    if not (d / "ledger.jsonl").is_file():
        raise UsageError(f"{d}: no ledger.jsonl; not a session directory")
    if args.out and not args.html:
        raise UsageError("--out names the HTML page: use it with --html")
    out = output_file(args.out, "--out", force=args.force, allowed=d / "report.html") if args.out else None
    b = write_artifacts(d)
    print_session(d, console)
    if args.html:
        console.print(f"HTML report: {write_html(d, out, breakdown=b)}", highlight=False, markup=False)
    return 0
