"""``inferloom verify SESSION_DIR|EXPORT.tar.gz``: check an export's SHA256SUMS (archive or unpacked),
then re-derive every headline number from the raw ledger records alone (:mod:`inferloom.verify`);
``--remeasure``: the final stack measured again in a fresh process (:mod:`inferloom.evidence.remeasure`);
``--rebuild``: first a virtualenv from the pin ledger, the re-measure with its python
(:mod:`inferloom.evidence.rebuild`). Each mismatch is one line naming the number, the recorded value, the
recomputed one and the ledger seq, exit 1; all consistent: a table of what was checked, exit 0; a
directory that can't be read: one line, exit 2."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from inferloom.commands.common import UsageError, progress_printer
from inferloom.evidence.rebuild import rebuild, record_remeasure, summary_lines
from inferloom.evidence.remeasure import final_stack, remeasure
from inferloom.evidence.trust import TRUST_FLAG, plan_lines
from inferloom.verify import verify_path
from inferloom.verify.sums import unpack

__all__ = ["run"]


def run(args: argparse.Namespace, console: Any, err: Any) -> int:
    given = [f for f, v in (("--venv", args.venv), ("--python", args.python), ("--find-links", args.find_links),
                            ("--no-index", args.no_index), ("--inferloom-source", args.inferloom_source != "auto")) if v]
    if given and not args.rebuild:
        raise UsageError(f"{', '.join(given)}: only with --rebuild (they say how its virtualenv is built)")
    if args.no_index and not args.find_links:
        raise UsageError("--no-index installs only from --find-links directories: give at least one --find-links DIR")
    if args.trust_session and not (args.remeasure or args.rebuild):
        raise UsageError(f"{TRUST_FLAG}: only with --remeasure or --rebuild (they run the session's code)")
    if args.max_pairs and not (args.remeasure or args.rebuild):
        raise UsageError("--max-pairs sizes the re-measurement: pass it with --remeasure (or --rebuild)")
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
    if not (args.remeasure or args.rebuild):
        return 1 if bad else 0
    if bad:  # a session whose numbers don't add up is not re-measured: nothing of it runs
        out(f"not re-measured: {bad} mismatch(es) above; a session (or archive) that fails verify runs no code here",
            highlight=False, markup=False, soft_wrap=True)
        return 1
    if Path(args.dir).is_file():  # an export archive: re-measured from its unpacked copy
        with tempfile.TemporaryDirectory(prefix="inferloom-remeasure-archive-") as tmp:
            return _remeasure(args, unpack(Path(args.dir), tmp), bad, out, err)
    return _remeasure(args, Path(args.dir), bad, out, err)


def _remeasure(args: argparse.Namespace, d: Path, bad: int, out: Any, err: Any) -> int:
    if not args.trust_session:  # the session author's code: said first, run only when the user says so
        for line in plan_lines(d, rebuild=args.rebuild):
            out(line, highlight=False, markup=False, soft_wrap=True)
        out(f"not re-measured: add {TRUST_FLAG} once you have read what it runs (docs/security.md)",
            highlight=False, markup=False, soft_wrap=True)
        return 1
    progress = progress_printer(args, err)
    rec = None
    if args.rebuild:
        final_stack(d.absolute())  # nothing to re-measure: said before a virtualenv is built
        rec = rebuild(d, venv=args.venv, python=args.python, find_links=args.find_links,
                      no_index=args.no_index, source=args.inferloom_source, progress=progress)
        for line in summary_lines(rec):
            out(line, highlight=False, markup=False, soft_wrap=True)
    r = remeasure(d, max_pairs=args.max_pairs, progress=progress,
                  python=rec["venv_python"] if rec else None)
    if rec is not None:
        record_remeasure(rec, r)
    src = r.get("source")
    if src:  # a custom workload: how the final stack was rebuilt
        out(f"remeasure source: {src['applied_with']} of {len(src['series'])} exported patch(es) on a fresh clone of "
            f"{src['checkout']} at {src['stock_commit'][:12]}: {src['why']}", highlight=False, markup=False, soft_wrap=True)
    if r.get("clock"):  # a custom workload: inferloom's clock against the objective's claimed gain
        c = r["clock"]
        out(f"remeasure clock check: {c['rule'] + ': ' if c.get('rule') else ''}{c.get('why')}",
            highlight=False, markup=False, soft_wrap=True)
    if r.get("written_kernels"):
        out(f"remeasure written kernels: {', '.join(r['written_kernels'])} (registered from the session's files after "
            "their sha256; imported in the sandboxed process)", highlight=False, markup=False, soft_wrap=True)
    if r.get("apart"):  # another host, day, driver or engine variable than the session's: said, not refused
        out(f"remeasure ran apart from the session: {'; '.join(r['apart'])}", highlight=False, markup=False,
            soft_wrap=True)
    out(f"remeasure (fresh process {r['pid']}" + (", sandboxed" if r.get("sandboxed") else "")
        + (f" of {r['python']}" if rec else "") + f", {r['seconds']:.0f} s): {r['why']}: "
        + ("PASS" if r["passed"] else "FAIL: the final stack's gain did not reproduce"),
        highlight=False, markup=False, soft_wrap=True)
    return 1 if bad or not r["passed"] else 0
