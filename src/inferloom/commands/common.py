"""What several CLI commands share: spec flags to a spec, ``KEY=VALUE`` lists,
progress lines, printing a session's report, the usage error, and the checks
every output flag goes through before anything runs (:func:`output_file`,
:func:`output_dir`): never write over a session's files, never over an
existing file unless asked (``--force``), and a one-line error (exit 2) for a
directory that is missing, is a file or can't be written."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from rich.markup import escape

from inferloom.errors import InferloomError
from inferloom.redact import redact_text
from inferloom.spec import WorkloadSpec, load_spec

__all__ = ["UsageError", "kv_list", "spec_from_args", "progress_printer", "print_session", "SESSION_FILES",
           "session_root", "output_file", "output_dir"]

# what a session directory holds at its top (a directory holding one of the first two is a session's)
SESSION_FILES = ("state.json", "ledger.jsonl", "manifest.json", "report.md", "session_breakdown.json", "report.html")


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


def spec_from_args(args: argparse.Namespace, *, convert_models: bool = True) -> WorkloadSpec:
    """The spec file named on the command line (if any) with the spec flags and ``--pin`` over it
    (``convert_models=False``: a ``.gguf`` model is checked, not converted; ``inferloom.spec.model``)."""
    overrides: dict[str, Any] = {}
    for name, value in vars(args).items():
        if name.startswith("spec__") and value is not None:
            overrides[name[len("spec__"):].replace("__", ".")] = value
    pins = kv_list(args.pin, "--pin")
    spec = load_spec(args.spec, overrides, convert_models=convert_models)
    if pins:
        spec = load_spec(args.spec, {**overrides, "pinned": {**spec.pinned, **pins}}, convert_models=convert_models)
    return spec


def progress_printer(args: argparse.Namespace, err: Any) -> Callable[[str], None]:
    """A progress callback: each message on ``err`` with the seconds since now, unless ``--quiet``."""
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        if not getattr(args, "quiet", False):
            err.print(f"[dim]{time.perf_counter() - t0:7.1f}s[/dim] {escape(redact_text(msg))}", highlight=False,
                      soft_wrap=True)

    return progress


def print_session(directory: Path, console: Any) -> None:
    report = directory / "report.md"
    if report.is_file():
        console.print(report.read_text(), highlight=False, markup=False)
    console.print(f"session directory: {directory} (report.md, session_breakdown.json, ledger.jsonl, state.json)",
                  highlight=False, markup=False)


def session_root(path: Path) -> Path | None:
    """The nearest directory at or above ``path`` (resolved) that holds a session
    (its state.json or ledger.jsonl), or None."""
    for p in (path, *path.parents):
        if (p / "state.json").exists() or (p / "ledger.jsonl").exists():
            return p
    return None


def _writable(directory: Path, flag: str, shown: Path) -> None:
    """Raise a UsageError unless a file can be created in ``directory`` (a probe, removed at once)."""
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".inferloom-probe-"):
            pass
    except OSError as exc:
        raise UsageError(f"{flag} {shown}: can't write in {directory} ({exc.strerror or exc}); "
                         "choose a writable location (nothing was written)") from None


def output_file(value: str | os.PathLike[str], flag: str, *, force: bool = False, allowed: Path | None = None,
                force_flag: str | None = "--force") -> Path:
    """Check an output file before anything runs; returns it as a Path.

    Refused (UsageError, exit 2, nothing written): a directory; a file whose
    directory is missing, is not a directory or can't be written; anything
    inside a session directory (:func:`session_root`); an existing file unless
    ``force``. ``allowed`` (resolved path) is the one file that may be rewritten
    in place (``report``'s own report.html)."""
    path = Path(value)
    real = path.resolve()
    if allowed is not None and real == allowed.resolve():
        _writable(real.parent, flag, path)
        return path
    if real.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; name a file (nothing was written)")
    parent = real.parent
    if not parent.exists():
        raise UsageError(f"{flag} {path}: directory {path.parent} does not exist; create it first or choose "
                         "another path (nothing was written)")
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: {path.parent} is not a directory (nothing was written)")
    root = session_root(parent)
    if root is not None:
        raise UsageError(f"{flag} {path}: inside the session directory {root}, whose files are that session's "
                         "record; choose a path outside it (nothing was written)")
    if real.exists() and not force:
        how = f"pass {force_flag} to replace it" if force_flag else "choose another path"
        raise UsageError(f"{flag} {path}: exists; {how} (nothing was written)")
    _writable(parent, flag, path)
    return path


def output_dir(value: str | os.PathLike[str], flag: str, *, own_session: Path | None = None) -> Path:
    """Check an output directory (created later, parents included) before anything runs.

    Refused (UsageError, exit 2): a path that is a file or lies under a file;
    a directory that already holds report files (a session's own state.json or
    ledger.jsonl is left to the caller, which says how to continue it); a
    directory inside another session's directory (``own_session``'s may be
    written into); a location that can't be written."""
    path = Path(value)
    real = path.resolve()
    if real.exists() and not real.is_dir():
        raise UsageError(f"{flag} {path}: is a file, not a directory (nothing was written)")
    existing = real
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{flag} {path}: {existing} is a file, not a directory (nothing was written)")
    if real.is_dir() and not ((real / "state.json").exists() or (real / "ledger.jsonl").exists()):
        held = [f for f in SESSION_FILES if (real / f).exists()]
        if held:
            raise UsageError(f"{flag} {path}: already holds {', '.join(held)}; choose a new or empty directory "
                             "(nothing was written)")
    root = session_root(real.parent)
    if root is not None and (own_session is None or root != own_session.resolve()):
        raise UsageError(f"{flag} {path}: inside the session directory {root}, whose files are that session's "
                         "record; choose a path outside it (nothing was written)")
    _writable(existing, flag, path)
    return path
