"""Gate (b2): judge the effect, not the text. The patch is applied by git
itself to a scratch index (a temporary index file of the session's bare
clone: nothing is written to any work tree), and what git changed is read
back from git (``git diff-index --cached --raw --numstat -z --no-renames``,
with modes). The same check runs again on the candidate's worktree right
after the real ``git apply --index`` (:func:`staged_effect`), so the tree that
is measured is the tree that was judged.

Rules, in the order checked:

* ``does_not_apply``: git can't apply it to the stack.
* ``patch_paths_mismatch``: the paths git changed are not exactly the paths
  the parser saw change (a ``-- `` trailer the parser stopped at while git
  read on, ``--- NOTES.md/bench.py`` that ``-p1`` turns into ``bench.py``,
  a no-op section...). Parser and git must agree, or the patch is refused.
* ``forbidden_mode``: a file mode other than 100644 / 100755, declared in the
  patch text (setuid 104755, which git would quietly store as 100755) or
  in git's result (a symbolic link 120000, a gitlink 160000), or a change git
  reports as a type change.
* every per-path rule of the policy (:func:`~inferloom.patches.policy.check_path`:
  ``absolute_path``, ``path_traversal``, ``touches_git_metadata``,
  ``touches_inferloom``, ``touches_entrypoint``, ``touches_quality_gate``,
  ``touches_benchmark_inputs``, ``touches_protected``, ``outside_allowlist``)
  on git's paths, so a delete, a rename (a delete plus an add, with
  ``--no-renames``) or a copy onto a protected file is refused by the path git
  wrote, whatever the text said.
* ``forbidden_pattern`` on the lines git added, ``patch_too_large`` on git's
  count of files and changed lines.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from inferloom.patches.parse import ParsedPatch, PatchRefusal
from inferloom.patches.policy import PatchPolicy, check_added_lines, check_path
from inferloom.workloads.custom import git

__all__ = ["ALLOWED_MODES", "GitChange", "Effect", "scratch_effect", "staged_effect", "check_effect",
           "PATHS_MISMATCH", "FORBIDDEN_MODE"]

PATHS_MISMATCH = "patch_paths_mismatch"
FORBIDDEN_MODE = "forbidden_mode"
ALLOWED_MODES = frozenset({"100644", "100755"})
_ABSENT = "000000"


@dataclass(frozen=True)
class GitChange:
    """One path git changed: its status (A, D, M, T), modes before and after
    (``000000``: absent) and ``git diff --numstat``'s line counts."""

    status: str
    old_mode: str
    new_mode: str
    path: str
    added: int = 0
    removed: int = 0


@dataclass
class Effect:
    """What git changed: the paths with their modes, and each path's added lines."""

    changes: list[GitChange]
    added_lines: dict[str, list[str]] = field(default_factory=dict)

    @property
    def paths(self) -> list[str]:
        return sorted({c.path for c in self.changes})


def _read(cwd: Path, base: str, env: dict[str, str] | None) -> Effect:
    out = git("diff-index", "--cached", "--raw", "--numstat", "-z", "--no-renames", "--no-ext-diff", base,
              cwd=cwd, env=env).stdout
    fields = out.split("\0")
    raw: list[tuple[str, str, str, str]] = []
    counts: dict[str, tuple[int, int]] = {}
    i = 0
    while i < len(fields):
        item = fields[i]
        if item.startswith(":"):  # ":OLDMODE NEWMODE OLDSHA NEWSHA STATUS" NUL PATH NUL
            old_mode, new_mode, _a, _b, status = item[1:].split(" ")
            raw.append((status, old_mode, new_mode, fields[i + 1]))
            i += 2
        elif item:  # "ADDED\tREMOVED\tPATH" NUL
            a, r, path = item.split("\t", 2)
            counts[path] = (int(a) if a.isdigit() else 0, int(r) if r.isdigit() else 0)
            i += 1
        else:
            i += 1
    changes = [GitChange(s, om, nm, p, *counts.get(p, (0, 0))) for s, om, nm, p in raw]
    patch = git("-c", "core.quotePath=false", "diff-index", "--cached", "-p", "-U0", "--no-renames", "--no-ext-diff",
                "--no-color", base, cwd=cwd, env=env).stdout
    added: dict[str, list[str]] = {}
    cur, in_hunks = "?", False
    for line in patch.split("\n"):
        if line.startswith("diff --git "):
            cur, in_hunks = line[len("diff --git "):], False
        elif not in_hunks and line.startswith("+++ "):
            cur = line[6:] if line.startswith("+++ b/") else line[4:]
        elif line.startswith("@@"):
            in_hunks = True
        elif in_hunks and line.startswith("+"):  # every added line, whatever its file's name looks like
            added.setdefault(cur, []).append(line[1:])
    return Effect(changes=changes, added_lines=added)


def scratch_effect(repo: Path, base: str, data: bytes, scratch: Path) -> Effect:
    """Apply ``data`` to ``base`` in a scratch index of the bare clone ``repo``
    (under ``scratch``; removed afterwards) and read what git changed.
    PatchRefusal ``does_not_apply`` when git refuses the patch."""
    scratch.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="effect-", dir=scratch)
    os.close(fd)
    index = Path(tmp + ".index")
    pfile = Path(tmp)
    try:
        pfile.write_bytes(data)
        env = {"GIT_INDEX_FILE": str(index)}
        git("read-tree", base, cwd=repo, env=env)
        res = git("apply", "--cached", "--whitespace=nowarn", str(pfile), cwd=repo, env=env, check=False)
        if res.returncode != 0:
            raise PatchRefusal("does_not_apply", "git apply refused it on the current stack: "
                                                 + (res.stderr.strip().splitlines() or ["?"])[0][:300])
        return _read(repo, base, env)
    finally:
        pfile.unlink(missing_ok=True)
        index.unlink(missing_ok=True)
        Path(str(index) + ".lock").unlink(missing_ok=True)


def staged_effect(tree: Path, base: str = "HEAD") -> Effect:
    """What the patch staged in worktree ``tree`` (applied with ``git apply --index``) against ``base``."""
    return _read(tree, base, None)


def check_effect(parsed: ParsedPatch, effect: Effect, policy: PatchPolicy, *, max_files: int,
                 max_changed_lines: int) -> None:
    """Raise PatchRefusal with the first rule (module docstring) the effect breaks."""
    said, did = set(parsed.changed_paths), set(effect.paths)
    if said != did:
        hidden, missing = sorted(did - said), sorted(said - did)
        why = "git and the parser disagree on what this patch changes: "
        why += "; ".join(x for x in (f"git also changed {', '.join(map(repr, hidden))}" if hidden else "",
                                     f"git left {', '.join(map(repr, missing))} unchanged" if missing else "") if x)
        raise PatchRefusal(PATHS_MISMATCH, why + " (text after a '-- ' trailer, a path prefix that -p1 strips, "
                                                 "a no-op section?); send a plain `git diff` of the change")
    for f in parsed.files:
        for mode in (f.old_mode, f.new_mode):
            if mode is not None and mode not in ALLOWED_MODES:
                raise PatchRefusal(FORBIDDEN_MODE, f"{'/'.join(f.paths)}: the patch declares file mode {mode}; only "
                                                   "100644 and 100755 (regular files) may be written")
    for c in effect.changes:
        for mode in (c.old_mode, c.new_mode):
            if mode != _ABSENT and mode not in ALLOWED_MODES:
                raise PatchRefusal(FORBIDDEN_MODE, f"{c.path!r}: git's result has file mode {mode} (120000: a "
                                                   "symbolic link, 160000: a gitlink); only regular files may change")
        if c.status not in ("A", "D", "M"):
            raise PatchRefusal(FORBIDDEN_MODE, f"{c.path!r}: git reports change type {c.status!r}; only adding, "
                                               "editing or deleting regular files is allowed")
    for c in effect.changes:
        check_path(c.path, policy)
    check_added_lines(effect.added_lines, policy.forbidden_patterns)
    if len(effect.changes) > max_files:
        raise PatchRefusal("patch_too_large", f"git changed {len(effect.changes)} files, the limit is {max_files}")
    lines = sum(c.added + c.removed for c in effect.changes)
    if lines > max_changed_lines:
        raise PatchRefusal("patch_too_large", f"git changed {lines} lines, the limit is {max_changed_lines}")
