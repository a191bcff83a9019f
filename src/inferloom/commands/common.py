"""What several CLI commands share: spec flags to a spec, ``KEY=VALUE`` lists,
progress lines, printing a session's report, and the usage error."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from rich.markup import escape

from inferloom.errors import InferloomError
from inferloom.spec import WorkloadSpec, load_spec

__all__ = ["UsageError", "kv_list", "spec_from_args", "progress_printer", "print_session"]


class UsageError(InferloomError, ValueError):
    """Bad flags: exit 2."""

    pass


def kv_list(items: Sequence[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{flag} '{item}': expected KEY=VALUE, for example {flag} cache_implementation=static")
        out[key.strip()] = value.strip()
    return out


def spec_from_args(args: argparse.Namespace) -> WorkloadSpec:
    """The spec file named on the command line (if any) with the spec flags and ``--pin`` over it."""
    overrides: dict[str, Any] = {}
    for name, value in vars(args).items():
        if name.startswith("spec__") and value is not None:
            overrides[name[len("spec__"):].replace("__", ".")] = value
    pins = kv_list(args.pin, "--pin")
    spec = load_spec(args.spec, overrides)
    if pins:
        spec = load_spec(args.spec, {**overrides, "pinned": {**spec.pinned, **pins}})
    return spec


def progress_printer(args: argparse.Namespace, err: Any) -> Callable[[str], None]:
    """A progress callback: each message on ``err`` with the seconds since now, unless ``--quiet``."""
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        if not getattr(args, "quiet", False):
            err.print(f"[dim]{time.perf_counter() - t0:7.1f}s[/dim] {escape(msg)}", highlight=False, soft_wrap=True)

    return progress


def print_session(directory: Path, console: Any) -> None:
    report = directory / "report.md"
    if report.is_file():
        console.print(report.read_text(), highlight=False, markup=False)
    console.print(f"session directory: {directory} (report.md, session_breakdown.json, ledger.jsonl, state.json)",
                  highlight=False, markup=False)
