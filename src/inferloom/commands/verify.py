"""``inferloom verify SESSION_DIR|EXPORT.tar.gz``: check an export's SHA256SUMS (archive or unpacked),
then re-derive every headline number from the raw ledger records alone (:mod:`inferloom.verify`). Each mismatch is one line naming the number, the recorded value, the
recomputed one and the ledger seq, exit 1; all consistent: a table of what was checked, exit 0; a
directory that can't be read: one line, exit 2."""

from __future__ import annotations

import argparse
from typing import Any

from inferloom.commands.common import UsageError, progress_printer
from inferloom.evidence.remeasure import remeasure
from inferloom.verify import verify_path

__all__ = ["run"]


def run(args: argparse.Namespace, console: Any, err: Any) -> int:
    if args.rebuild:
        raise UsageError("--rebuild (a fresh virtualenv from the pin ledger, then the re-measure inside it) is not "
                         "built yet; the pin ledger is in manifest.json (pins); use --remeasure in this environment")
    if args.max_pairs and not args.remeasure:
        raise UsageError("--max-pairs sizes the re-measurement: pass it with --remeasure")
    f = verify_path(args.dir)
    out = console.print
    for c in f.mismatches:
        where = f"ledger seq {c.seq}; {c.how}" if c.seq is not None else c.how
        out(f"MISMATCH {c.group}: {c.name}: recorded {c.recorded!r}, recomputed {c.recomputed!r} ({where})",
            highlight=False, markup=False, soft_wrap=True)
    out(f"{'checked':<22} {'numbers':>7} {'mismatches':>10}  compared", highlight=False, markup=False)
    for group, n, bad, how in f.summary():
        out(f"{group:<22} {n:>7} {bad:>10}  {how}", highlight=False, markup=False)
    for note in f.notes:
        out(f"note: {note}", highlight=False, markup=False)
    bad = len(f.mismatches)
    out(f"{args.dir}: {len(f.checks)} numbers re-derived from the ledger, "
        + (f"{bad} mismatch(es)" if bad else "all consistent"), highlight=False, markup=False)
    if not args.remeasure:
        return 1 if bad else 0
    r = remeasure(args.dir, max_pairs=args.max_pairs, progress=progress_printer(args, err))
    out(f"remeasure (fresh process {r['pid']}, {r['seconds']:.0f} s): {r['why']}: "
        + ("PASS" if r["passed"] else "FAIL: the final stack's gain did not reproduce"),
        highlight=False, markup=False, soft_wrap=True)
    return 1 if bad or not r["passed"] else 0
