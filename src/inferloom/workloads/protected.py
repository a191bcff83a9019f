"""Protected files: checksums taken from stock, verified before every run.

The files that define how a custom workload is measured and judged (the
entrypoint, the quality gate, the benchmark inputs, anything the spec lists in
``custom.patches.protected``, and any file the entrypoint command names) are
read from stock's commit (the user's checkout's HEAD) when a session starts
(:func:`take_protected`, in the session's fresh checkout of it), recorded in
``state.json`` and the ledger (kind ``protected_files``), and checked in the
tree of every run immediately before it starts (:func:`verify_protected`, called
first thing by :meth:`~inferloom.workloads.custom.CustomAdapter.run`). A
mismatch is a failed run of kind :data:`PROTECTED_CHANGED`, so the trial fails
and nothing is kept.

This holds whatever the patch gates missed: a file written into the tree by
anyone between apply and measure, or by a candidate's own code during an
earlier run, is caught at the next run. What it can't see: a file changed and
restored within one run, and code that changes behaviour without changing a
protected file (an import that shadows one, a monkeypatch at run time); the
sandbox and a person's review are the answers there (docs/security.md).
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import os
import stat
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Sequence

from inferloom.session.state_models import ProtectedFile, ProtectedFiles

__all__ = ["PROTECTED_CHANGED", "matching_prefix", "protected_patterns", "take_protected", "verify_protected"]

PROTECTED_CHANGED = "protected_file_changed"
_FILE_MODES = ("100644", "100755", "120000")
_IGNORED_DIRS = frozenset({"__pycache__"})
# path -> (stat identity, sha256) of large files (see _sha256)
_CACHE_MIN = 1 << 20
_CACHE: dict[str, tuple[tuple[int, ...], str]] = {}


def matching_prefix(path: str, patterns: Sequence[str]) -> tuple[str, str] | None:
    """(pattern, the shortest prefix of ``path`` it matches: the path itself or a
    directory above it), for the first pattern that matches; None when none does.
    Patterns are ``fnmatch`` patterns over the whole relative path (``*`` crosses ``/``)."""
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[:k]) for k in range(1, len(parts) + 1)]
    for pat in patterns:
        pat_n = pat.rstrip("/")
        for pre in prefixes:
            if fnmatch.fnmatchcase(pre, pat_n):
                return pat, pre
    return None


def protected_patterns(custom: Any) -> list[str]:
    """Every protected pattern of a ``custom`` spec section, plus the entrypoint's
    own arguments (each as an exact path: ``[python3, bench.py]`` protects ``bench.py``)."""
    p = custom.patches
    args = [glob.escape(a) for a in custom.entrypoint[1:] if a and not a.startswith("-") and not os.path.isabs(a)]
    out: list[str] = []
    for pat in (*custom.entrypoint_files, *p.quality_gate, *p.benchmark_inputs, *p.protected, *args):
        if pat not in out:
            out.append(pat)
    return out


def _git(repo: Path, *args: str) -> bytes:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"}
    res = subprocess.run(["git", "-c", "core.hooksPath=/dev/null", *args], cwd=repo, env=env,
                         capture_output=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:2])} failed in {repo}: "
                           f"{res.stderr.decode(errors='replace').strip()[-500:]}")
    return res.stdout


def take_protected(tree: str | Path, commit: str, patterns: Sequence[str]) -> ProtectedFiles:
    """The protected files of ``commit``, read from ``tree``: a clean checkout of
    it (the session's fresh ``trees/stock``; git's listing says which paths and
    modes, the files on disk give the bytes a run sees, after any checkout
    filter or end-of-line conversion the repository declares)."""
    root = Path(tree)
    listing = _git(root, "ls-tree", "-r", "-z", "--full-tree", commit).decode("utf-8", "surrogateescape")
    files: list[ProtectedFile] = []
    dirs: set[str] = set()
    for item in listing.split("\0"):
        if not item:
            continue
        meta, path = item.split("\t", 1)
        mode, kind, _obj = meta.split(" ")
        hit = matching_prefix(path, patterns)
        if hit is None or kind != "blob" or mode not in _FILE_MODES:
            continue
        p = root / path
        if mode == "120000":
            digest = hashlib.sha256(os.fsencode(os.readlink(p))).hexdigest()
        else:
            digest = _sha256(p, os.lstat(p))
        files.append(ProtectedFile(path=path, mode=mode, sha256=digest))
        if hit[1] != path:
            dirs.add(hit[1])
    return ProtectedFiles(commit=commit, patterns=list(patterns), files=files, dirs=sorted(dirs))


def _sha256(p: Path, st: os.stat_result) -> str:
    """sha256 of ``p``; a large file (1 MiB or more: a data set) whose inode, size,
    mtime, ctime and mode are all unchanged since it was last hashed is not read again
    (a write changes ctime, which no unprivileged process can set back)."""
    ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)
    hit = _CACHE.get(str(p))
    if hit is not None and hit[0] == ident and st.st_size >= _CACHE_MIN:
        return hit[1]
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    _CACHE[str(p)] = (ident, h.hexdigest())
    return h.hexdigest()


def _files_under(root: Path, rel: str) -> Iterable[str]:
    for dirpath, dirnames, filenames in os.walk(root / rel):
        dirnames[:] = [d for d in dirnames if d not in _IGNORED_DIRS]
        for name in filenames:
            if not name.endswith(".pyc"):
                yield (Path(dirpath) / name).relative_to(root).as_posix()


def _problem(root: Path, f: ProtectedFile) -> str | None:
    p = root / f.path
    try:
        st = os.lstat(p)
    except OSError:
        return "is missing"
    if f.mode == "120000":
        ok = stat.S_ISLNK(st.st_mode) and hashlib.sha256(os.fsencode(os.readlink(p))).hexdigest() == f.sha256
        return None if ok else "is no longer the same symbolic link"
    if not stat.S_ISREG(st.st_mode):
        return "is no longer a regular file (a symbolic link or something else took its place)"
    if bool(st.st_mode & 0o100) != (f.mode == "100755"):
        return f"changed mode (stock: {f.mode})"
    # a set-id or sticky bit is a change too (git never writes one)
    if st.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX):
        return "has a set-id or sticky bit"
    if _sha256(p, st) != f.sha256:
        return "changed content (sha256 differs from stock's)"
    return None


def verify_protected(tree: str | Path, protected: ProtectedFiles | None) -> str | None:
    """None when every protected file in ``tree`` is as stock had it, else a
    one-line message naming the first that is not (``protected``: None checks nothing)."""
    if protected is None:
        return None
    root = Path(tree)
    for f in protected.files:
        why = _problem(root, f)
        if why is not None:
            return (f"{PROTECTED_CHANGED}: {f.path} {why} in tree {root.name}; the run is refused "
                    "(no candidate may change how it is measured or judged)")
    known = {f.path for f in protected.files}
    for d in protected.dirs:
        extra = sorted(set(_files_under(root, d)) - known)
        if extra:
            return (f"{PROTECTED_CHANGED}: {extra[0]} appeared in the protected directory {d}/ in tree "
                    f"{root.name}; the run is refused (no candidate may change the benchmark's inputs)")
    return None
