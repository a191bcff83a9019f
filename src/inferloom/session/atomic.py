"""Crash-safe JSON file writes for the session directory.

Contract of :func:`write_json_atomic`: after it returns, ``path`` holds the
complete new document and that is durable (file and directory entry fsync'd).
If it raises, or the process dies at any moment while it runs, ``path`` still
holds the complete previous document (or still does not exist): a reader never
sees a half-written file. An exception inside the call removes its temp file;
a hard kill can leave one behind (``.<name>.<random>.tmp`` in the same
directory), which :func:`remove_stale_temps` deletes and which readers ignore.

Serialisation is strict: ``NaN`` / ``inf`` and objects that are not JSON types
raise (``ValueError`` / ``TypeError``) before ``path`` is touched, so a
document is always standard JSON. Callers encode such values explicitly
(for example ``None`` for a missing number).

Linux / POSIX only (directory fsync). Safe for one writer per path.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["write_json_atomic", "fsync_dir", "remove_stale_temps", "temp_prefix"]


def temp_prefix(path: Path) -> str:
    """The name prefix of ``path``'s temp files (hidden, in the same directory)."""
    return "." + Path(path).name + "."


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """fsync a directory so that a rename or file creation inside it is durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, indent: int | None = 2) -> None:
    """Write ``data`` as JSON to ``path`` atomically and durably.

    Temp file in the same directory, write, flush, fsync the file,
    ``os.replace`` onto ``path``, fsync the directory. Creates the parent
    directory if needed. See the module docstring for the guarantees.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=indent, allow_nan=False, sort_keys=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def remove_stale_temps(path: str | os.PathLike[str]) -> list[Path]:
    """Delete temp files a killed :func:`write_json_atomic` left next to ``path``.

    Only call it from the one process that writes ``path`` (a concurrent
    writer's in-flight temp file would be deleted too). Returns what was removed.
    """
    path = Path(path)
    removed: list[Path] = []
    if not path.parent.is_dir():
        return removed
    prefix = temp_prefix(path)
    for p in path.parent.iterdir():
        if p.name.startswith(prefix) and p.name.endswith(".tmp") and p.is_file():
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed
