"""``inferloom bench``: stock against a candidate (or A/A), through the protocol and the quality contract."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from inferloom.bench import run_bench
from inferloom.commands.common import UsageError, kv_list, output_file, progress_printer, spec_from_args
from inferloom.preflight import check_runnable
from inferloom.report.console import print_bench
from inferloom.redact import redact
from inferloom.session.atomic import write_json_atomic

__all__ = ["run", "PairLog"]


class PairLog:
    """Each timed pair as it completes, one JSON line in ``<out>.pairs.jsonl``: what an interrupted bench
    leaves (raw pairs, no verdict: an unfinished measurement decides nothing); removed once ``<out>`` holds
    the whole result."""

    def __init__(self, out: Path, force: bool = False) -> None:
        self.path = out.with_name(out.name + ".pairs.jsonl")
        if self.path.exists() and not force:  # an earlier interrupted bench's pairs: never deleted unasked
            raise UsageError(f"--out {out}: {self.path} holds the pairs of an interrupted bench; move it, or pass "
                             "--force to replace it (nothing was written)")
        self.path.unlink(missing_ok=True)
        self.count = 0

    def add(self, pair: Any, decision: Any) -> None:
        line = {"pair": pair.to_dict(), "verdict_so_far": getattr(decision, "verdict", None)}
        self.path.parent.mkdir(parents=True, exist_ok=True)  # the default runs/ may not exist yet
        with open(self.path, "a") as f:
            f.write(json.dumps(redact(line)) + "\n")
        self.count += 1

    def said(self) -> str:
        if not self.count:
            return "no pair had completed; nothing was written"
        return (f"the {self.count} pair(s) measured are in {self.path} (raw pairs, no verdict: an unfinished "
                "measurement decides nothing; run the bench again for one)")

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def run(args: argparse.Namespace, console: Any, err: Any) -> int:
    spec = spec_from_args(args)
    candidate = kv_list(args.candidate, "--candidate")
    if not args.aa and not candidate:
        raise UsageError("bench needs --candidate KEY=VALUE (see `inferloom knobs`) or --aa for the noise floor")
    if args.out:  # checked before anything runs: a bench takes minutes
        out = output_file(args.out, "--out", force=args.force)
    else:
        out = Path("runs") / f"{'aa' if args.aa else 'bench'}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    check_runnable(spec)  # a configuration that can't work: exit 2, before anything runs
    partial = PairLog(out, force=args.force)  # checked before anything runs, like --out
    progress = progress_printer(args, err)
    try:
        res = run_bench(spec, candidate, aa=args.aa, progress=progress, quality=not args.no_quality,
                        out_hint=str(out), on_pair=partial.add)
    except KeyboardInterrupt:
        print(f"inferloom bench: interrupted; {partial.said()}", file=sys.stderr)
        return 130
    write_json_atomic(out, redact(res))
    partial.remove()
    print_bench(res, console, str(out))
    return 1 if res.get("verdict") == "failed" else 0
