"""Command line: thin. Parse -> spec -> the job. Errors are one line, no traceback.

Exit codes: 0 success; 1 the job ran and failed (a run or a preparation
failed); 2 bad input (spec, flags, candidate, a damaged session file); 130
interrupted. Every :class:`~inferloom.errors.InferloomError` carries its own
``exit_code``; main() maps it to one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from inferloom.errors import EXIT_BAD_INPUT, InferloomError
from inferloom.session.atomic import write_json_atomic

__all__ = ["main", "build_parser"]

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
}


class UsageError(InferloomError, ValueError):
    """Bad flags: exit 2."""

    pass


def _kv_list(items: Sequence[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{flag} '{item}': expected KEY=VALUE, for example {flag} cache_implementation=static")
        out[key.strip()] = value.strip()
    return out


def _add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", nargs="?", help="workload spec (YAML); flags below override its fields")
    g = p.add_argument_group("workload fields (same names as the spec)")
    for flag, key in SPEC_FLAGS.items():
        g.add_argument(flag, dest="spec__" + key.replace(".", "__"), metavar="VALUE", help=f"spec field {key}")
    g.add_argument("--pin", action="append", metavar="KEY=VALUE", help="pin a knob: part of stock, no candidate may change it")


def build_parser() -> argparse.ArgumentParser:
    from inferloom import __version__

    parser = argparse.ArgumentParser(prog="inferloom", description="Autonomous, vendor-neutral inference optimizer.")
    parser.add_argument("--version", action="version", version=f"inferloom {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("bench", help="measure stock vs a candidate (or A/A) through the protocol and quality contract")
    _add_spec_args(b)
    b.add_argument("--candidate", action="append", metavar="KEY=VALUE", help="a knob of the candidate (repeatable)")
    b.add_argument("--aa", action="store_true", help="A/A: measure stock against itself (the noise floor)")
    b.add_argument("--out", metavar="FILE", help="result JSON (default runs/bench-<time>.json)")
    b.add_argument("--no-quality", action="store_true", help="skip the quality contract (result marked unscored)")
    b.add_argument("--quiet", action="store_true", help="no progress lines")

    o = sub.add_parser("optimize", help="run an optimization session (PRELUDE -> FRAMEWORK -> ... -> CLOSE)")
    _add_spec_args(o)
    o.add_argument("--budget-minutes", type=float, default=30.0, metavar="N", help="wall-clock budget (default 30)")
    o.add_argument("--max-trials", type=int, default=20, metavar="N", help="candidate trials at most (default 20)")
    o.add_argument("--cycles", type=int, default=3, metavar="N", help="cycle ceiling (default 3)")
    o.add_argument("--no-sweep", action="store_true", help="skip the SWEEP phase")
    o.add_argument("--kb", metavar="URL", help="knowledge base (default $INFERLOOM_KB or ~/.cache/inferloom/kb.sqlite)")
    o.add_argument("--no-kb", action="store_true", help="no warm replay and no recipe filed at CLOSE")
    o.add_argument("--out", metavar="DIR", help="session directory (default runs/session-<time>)")
    o.add_argument("--quiet", action="store_true", help="no progress lines")

    r = sub.add_parser("resume", help="continue a session after a crash, a kill or a stop")
    r.add_argument("dir", help="session directory")
    r.add_argument("--quiet", action="store_true", help="no progress lines")

    rep = sub.add_parser("report", help="re-render report.md and session_breakdown.json from the ledger alone")
    rep.add_argument("dir", help="session directory")
    rep.add_argument("--html", action="store_true", help="also write a self-contained HTML page (charts inline)")
    rep.add_argument("--out", metavar="FILE", help="where --html writes the page (default DIR/report.html)")

    ex = sub.add_parser("export", help="write a session's kept changes (patch series + final configuration) for review")
    ex.add_argument("dir", help="session directory")
    ex.add_argument("--out", metavar="DIR", help="where to write (default DIR/export; must be absent or empty)")

    kb = sub.add_parser("kb", help="the recipe knowledge base: lookup, list, show, export, import")
    kb.add_argument("--kb", metavar="URL", help="SQL URL or SQLite path (default $INFERLOOM_KB or ~/.cache/inferloom/kb.sqlite)")
    kbs = kb.add_subparsers(dest="kb_command", required=True)
    kl = kbs.add_parser("lookup", help="show each lookup tier tried for a workload spec and what it found")
    _add_spec_args(kl)
    kl.add_argument("--min-confidence", type=float, default=0.0)
    kbs.add_parser("list", help="every recipe, a line each")
    ks = kbs.add_parser("show", help="one recipe in full (JSON)")
    ks.add_argument("id", help="recipe id")
    ke = kbs.add_parser("export", help="write the whole KB as JSON")
    ke.add_argument("file")
    ki = kbs.add_parser("import", help="merge a JSON export (strict rules, idempotent)")
    ki.add_argument("file")

    k = sub.add_parser("knobs", help="list the knob space of the workload's adapter")
    _add_spec_args(k)

    v = sub.add_parser("validate", help="validate a spec and print it resolved")
    _add_spec_args(v)
    return parser


def _spec_from_args(args: argparse.Namespace) -> Any:
    from inferloom.spec import load_spec

    overrides: dict[str, Any] = {}
    for name, value in vars(args).items():
        if name.startswith("spec__") and value is not None:
            overrides[name[len("spec__"):].replace("__", ".")] = value
    pins = _kv_list(args.pin, "--pin")
    spec = load_spec(args.spec, overrides)
    if pins:
        spec = load_spec(args.spec, {**overrides, "pinned": {**spec.pinned, **pins}})
    return spec


def _cmd_bench(args: argparse.Namespace, console: Any, err: Any) -> int:
    from inferloom.bench import run_bench
    from inferloom.report.console import print_bench

    spec = _spec_from_args(args)
    candidate = _kv_list(args.candidate, "--candidate")
    if not args.aa and not candidate:
        raise UsageError("bench needs --candidate KEY=VALUE (see `inferloom knobs`) or --aa for the noise floor")
    out = Path(args.out) if args.out else Path("runs") / f"{'aa' if args.aa else 'bench'}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        if not args.quiet:
            from rich.markup import escape

            err.print(f"[dim]{time.perf_counter() - t0:7.1f}s[/dim] {escape(msg)}", highlight=False, soft_wrap=True)

    res = run_bench(spec, candidate, aa=args.aa, progress=progress, quality=not args.no_quality, out_hint=str(out))
    write_json_atomic(out, res)
    print_bench(res, console, str(out))
    return 1 if res.get("verdict") == "failed" else 0


def _progress(args: argparse.Namespace, err: Any) -> Any:
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        if not getattr(args, "quiet", False):
            from rich.markup import escape

            err.print(f"[dim]{time.perf_counter() - t0:7.1f}s[/dim] {escape(msg)}", highlight=False, soft_wrap=True)

    return progress


def _print_session(directory: Path, console: Any) -> None:
    report = directory / "report.md"
    if report.is_file():
        console.print(report.read_text(), highlight=False, markup=False)
    console.print(f"session directory: {directory} (report.md, session_breakdown.json, ledger.jsonl, state.json)",
                  highlight=False, markup=False)


def _cmd_optimize(args: argparse.Namespace, console: Any, err: Any) -> int:
    from inferloom.phases.runner import start

    spec = _spec_from_args(args)
    out = Path(args.out) if args.out else Path("runs") / f"session-{time.strftime('%Y%m%d-%H%M%S')}"
    progress = _progress(args, err)
    progress(f"session directory: {out}; budget {args.budget_minutes:g} min, {args.max_trials} trials; "
             f"`inferloom resume {out}` continues it if interrupted")
    kb_url = None if args.no_kb else (args.kb or "default")
    start(out, spec, budget_minutes=args.budget_minutes, max_trials=args.max_trials, progress=progress,
          cycle_ceiling=args.cycles, sweep=not args.no_sweep, kb_url=kb_url)
    _print_session(out, console)
    return 0


def _cmd_resume(args: argparse.Namespace, console: Any, err: Any) -> int:
    from inferloom.phases.runner import resume

    resume(args.dir, progress=_progress(args, err))
    _print_session(Path(args.dir), console)
    return 0


def _cmd_report(args: argparse.Namespace, console: Any, err: Any) -> int:
    from inferloom.report import write_artifacts, write_html

    d = Path(args.dir)
    if not (d / "ledger.jsonl").is_file():
        raise UsageError(f"{d}: no ledger.jsonl; not a session directory")
    if args.out and not args.html:
        raise UsageError("--out names the HTML page: use it with --html")
    b = write_artifacts(d)
    _print_session(d, console)
    if args.html:
        console.print(f"HTML report: {write_html(d, args.out, breakdown=b)}", highlight=False, markup=False)
    return 0


def _cmd_export(args: argparse.Namespace, console: Any, err: Any) -> int:
    from inferloom.patches.export import export_session

    res = export_session(args.dir, args.out)
    console.print(f"exported to {res['out']}: {len(res['series'])} patch(es), final_config.json, README.md "
                  "(for review: inferloom never promotes anything)", highlight=False, markup=False)
    return 0


def _cmd_kb(args: argparse.Namespace, console: Any, err: Any) -> int:
    import json

    from inferloom.kb import RecipeStore, WorkloadKey, format_lookup

    with RecipeStore(args.kb) as store:
        if args.kb_command == "lookup":
            spec = _spec_from_args(args)
            res = store.lookup(WorkloadKey.from_spec(spec), min_confidence=args.min_confidence)
            console.print(format_lookup(res), highlight=False, markup=False)
        elif args.kb_command == "list":
            recipes = store.list_recipes()
            if not recipes:
                console.print("the knowledge base holds no recipe yet", highlight=False)
            for r in recipes:
                w = r.winner or {}
                ratio = f"x{w['ratio']:.3f}" if w.get("ratio") else "no winner"
                console.print(f"#{r.id} {r.status:5s} {ratio:10s} " + " | ".join(str(v) for v in r.key.to_dict().values()),
                              highlight=False, markup=False)
        elif args.kb_command == "show":
            console.print(json.dumps(store.show(args.id).to_dict(), indent=2, default=str), highlight=False, markup=False)
        elif args.kb_command == "export":
            doc = store.export_document()
            write_json_atomic(args.file, doc)
            console.print(f"exported {len(doc.get('recipes', []))} recipes to {args.file}", highlight=False)
        elif args.kb_command == "import":
            r = store.import_json(args.file)
            console.print(f"imported {args.file}: {r}", highlight=False, markup=False)
    return 0


def _cmd_knobs(args: argparse.Namespace, console: Any, err: Any) -> int:
    from inferloom.report.console import print_knobs
    from inferloom.workloads.registry import make_adapter

    spec = _spec_from_args(args)
    adapter = make_adapter(spec)
    try:
        print_knobs(adapter.describe(), adapter.knob_space(), console)
    finally:
        adapter.close()
    return 0


def _cmd_validate(args: argparse.Namespace, console: Any, err: Any) -> int:
    import yaml

    spec = _spec_from_args(args)
    console.print(yaml.safe_dump(spec.to_dict(), sort_keys=False), highlight=False)
    return 0


def _error_line(command: str, exc: InferloomError) -> str:
    """The one line printed for ``exc`` (see :mod:`inferloom.errors` for the exit codes)."""
    if exc.exit_code == EXIT_BAD_INPUT:
        return f"inferloom {command}: error: {exc}"
    kind = getattr(exc, "kind", None)
    head = f"failed ({kind})" if kind else "failed"
    return f"inferloom {command}: {head}: {exc}." + (f" {exc.hint}" if exc.hint else "")


def main(argv: Sequence[str] | None = None) -> int:
    from rich.console import Console

    # Not a terminal (a pipe, a log, CI): wide enough that tables don't truncate names.
    console = Console(width=None if sys.stdout.isatty() else 160)
    err = Console(stderr=True)
    args = build_parser().parse_args(argv)
    handler = {"bench": _cmd_bench, "knobs": _cmd_knobs, "validate": _cmd_validate, "optimize": _cmd_optimize,
               "resume": _cmd_resume, "report": _cmd_report, "kb": _cmd_kb, "export": _cmd_export}[args.command]
    try:
        return handler(args, console, err)
    except InferloomError as exc:
        print(_error_line(args.command, exc), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("inferloom: interrupted; nothing was written for the unfinished measurement", file=sys.stderr)
        return 130

if __name__ == "__main__":
    sys.exit(main())
