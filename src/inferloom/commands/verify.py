"""``inferloom verify SESSION_DIR|EXPORT.tar.gz``: check an export's SHA256SUMS (archive or unpacked),
then re-derive every headline number from the raw ledger records alone (:mod:`inferloom.verify`). Each mismatch is one line naming the number, the recorded value, the
recomputed one and the ledger seq, exit 1; all consistent: a table of what was checked, exit 0; a
directory that can't be read: one line, exit 2."""

from __future__ import annotations

import argparse
from typing import Any

from inferloom.verify import verify_path

__all__ = ["run"]


def run(args: argparse.Namespace, console: Any, err: Any) -> int:
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
    return 1 if bad else 0
