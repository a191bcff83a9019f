"""Gate (b): may this patch touch what it touches? Deterministic rules over
the parsed patch and the tree it would apply to; the first rule broken
refuses it (:class:`~inferloom.patches.parse.PatchRefusal`).

Rules, in the order checked, per touched path:

* ``absolute_path`` / ``path_traversal``: an absolute path, or a ``..``
  component: nothing outside the checkout.
* ``touches_git_metadata``: a ``.git`` component.
* ``symlink_created``: a file mode 120000 (a symbolic link) on either side.
* ``touches_inferloom``: a path component named ``inferloom`` or
  ``.inferloom`` (inferloom itself, its configuration or its state).
* ``touches_entrypoint`` / ``touches_quality_gate`` /
  ``touches_benchmark_inputs``: the files the spec declares as the
  entrypoint, the quality gate and the benchmark inputs (a pattern matches the
  path itself, or a directory above it).
* ``outside_allowlist``: no allowlist pattern matches (an empty allowlist
  admits nothing).
* ``forbidden_pattern``: an added line matches a user-declared regex.
* ``symlink_followed``: the path, or a directory on it, is a symbolic link
  in the tree the patch would apply to.

Patterns are ``fnmatch`` patterns against the whole path relative to the
checkout (``*`` also crosses ``/``).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Sequence

from inferloom.patches.parse import ParsedPatch, PatchRefusal

__all__ = ["PatchPolicy", "check_policy"]


@dataclass(frozen=True)
class PatchPolicy:
    allowlist: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()
    quality_gate: tuple[str, ...] = ()
    benchmark_inputs: tuple[str, ...] = ()
    forbidden_patterns: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_spec(cls, custom: Any) -> "PatchPolicy":
        p = custom.patches
        return cls(allowlist=tuple(p.allowlist), entrypoint=tuple(custom.entrypoint_files),
                   quality_gate=tuple(p.quality_gate), benchmark_inputs=tuple(p.benchmark_inputs),
                   forbidden_patterns=tuple(p.forbidden_patterns))


def _matches(path: str, patterns: Sequence[str]) -> str | None:
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[:k]) for k in range(1, len(parts) + 1)]
    for pat in patterns:
        pat_n = pat.rstrip("/")
        if any(fnmatch.fnmatchcase(pre, pat_n) for pre in prefixes):
            return pat
    return None


def check_policy(patch: ParsedPatch, policy: PatchPolicy, tree: Path | None = None) -> None:
    """Raise PatchRefusal with the first rule ``patch`` breaks; return None when it passes."""
    for f in patch.files:
        for path in f.paths:
            if path.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", path):
                raise PatchRefusal("absolute_path", f"{path!r} is absolute; a patch may only touch files inside the checkout")
            parts = re.split(r"[\\/]", path)
            if ".." in parts:
                raise PatchRefusal("path_traversal", f"{path!r} climbs out of the checkout ('..'); refused")
            if ".git" in parts:
                raise PatchRefusal("touches_git_metadata", f"{path!r} is git metadata; refused")
        for mode in (f.old_mode, f.new_mode):
            if mode is not None and mode.startswith("120"):
                raise PatchRefusal("symlink_created", f"{'/'.join(f.paths)}: file mode {mode} is a symbolic link; "
                                                      "a patch may not create, change or remove links")
        for path in f.paths:
            if {"inferloom", ".inferloom"} & set(PurePosixPath(path).parts):
                raise PatchRefusal("touches_inferloom", f"{path!r} is inferloom itself or its state; refused")
            for rule, pats, what in (("touches_entrypoint", policy.entrypoint, "the entrypoint"),
                                     ("touches_quality_gate", policy.quality_gate, "the quality gate"),
                                     ("touches_benchmark_inputs", policy.benchmark_inputs, "the benchmark inputs")):
                pat = _matches(path, pats)
                if pat is not None:
                    raise PatchRefusal(rule, f"{path!r} is part of {what} (spec pattern {pat!r}); "
                                             "no candidate may change how it is measured or judged")
            if _matches(path, policy.allowlist) is None:
                raise PatchRefusal("outside_allowlist", f"{path!r} matches no allowlist pattern "
                                                        f"({', '.join(policy.allowlist) or 'the allowlist is empty'}); "
                                                        "add it to custom.patches.allowlist if it may change")
    for pat in policy.forbidden_patterns:
        rx = re.compile(pat)
        for f in patch.files:
            for line in f.added:
                if rx.search(line):
                    raise PatchRefusal("forbidden_pattern", f"an added line in {f.new_path!r} matches the forbidden "
                                                            f"pattern {pat!r}: {line.strip()[:120]!r}")
    if tree is not None:
        root = Path(tree)
        for path in patch.paths:
            cur = root
            for part in PurePosixPath(path).parts:
                cur = cur / part
                if cur.is_symlink():
                    raise PatchRefusal("symlink_followed", f"{path!r} goes through the symbolic link "
                                                           f"{cur.relative_to(root)}; refused")
