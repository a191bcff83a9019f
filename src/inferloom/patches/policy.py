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
  ``touches_benchmark_inputs`` / ``touches_protected``: the files the spec
  declares as the entrypoint, the quality gate, the benchmark inputs and
  anything else it protects (``custom.patches.protected``); a pattern
  matches the path itself, or a directory above it.
* ``outside_allowlist``: no allowlist pattern matches (an empty allowlist
  admits nothing).
* ``forbidden_pattern``: an added line matches a user-declared regex, as
  written or with adjacent string literals joined (``'sub' + 'process'``
  reads as ``'subprocess'``), line by line and over each file's added lines
  together. This is a **tripwire, not a boundary**: a regex can't tell what
  code does (``chr(115) + ...``, ``getattr``, bytes decoded at run time all get
  past it). The boundaries are the sandbox the entrypoint runs in and the
  protected files' checksums verified before every run
  (:mod:`inferloom.workloads.protected`); this check only catches the
  careless and the obvious early, with a named rule.
* ``symlink_followed``: the path, or a directory on it, is a symbolic link
  in the tree the patch would apply to.

Patterns are ``fnmatch`` patterns against the whole path relative to the
checkout (``*`` also crosses ``/``). These rules judge the paths the patch's
*text* names; :mod:`inferloom.patches.effect` applies the same per-path rules
(:func:`check_path`, :func:`check_added_lines`) to what ``git apply`` changed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Mapping, Sequence

from inferloom.patches.parse import ParsedPatch, PatchRefusal
from inferloom.workloads.protected import matching_prefix

__all__ = ["PatchPolicy", "check_policy", "check_path", "check_added_lines", "matches"]


@dataclass(frozen=True)
class PatchPolicy:
    allowlist: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()
    quality_gate: tuple[str, ...] = ()
    benchmark_inputs: tuple[str, ...] = ()
    protected: tuple[str, ...] = ()
    forbidden_patterns: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_spec(cls, custom: Any) -> "PatchPolicy":
        p = custom.patches
        return cls(allowlist=tuple(p.allowlist), entrypoint=tuple(custom.entrypoint_files),
                   quality_gate=tuple(p.quality_gate), benchmark_inputs=tuple(p.benchmark_inputs),
                   protected=tuple(p.protected), forbidden_patterns=tuple(p.forbidden_patterns))


def matches(path: str, patterns: Sequence[str]) -> str | None:
    """The first pattern matching ``path`` or a directory above it (None: no match);
    the same matching as the protected files' checksums."""
    hit = matching_prefix(path, patterns)
    return None if hit is None else hit[0]


def _check_location(path: str) -> None:
    if path.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", path):
        raise PatchRefusal("absolute_path", f"{path!r} is absolute; a patch may only touch files inside the checkout")
    parts = re.split(r"[\\/]", path)
    if ".." in parts:
        raise PatchRefusal("path_traversal", f"{path!r} climbs out of the checkout ('..'); refused")
    if ".git" in parts:
        raise PatchRefusal("touches_git_metadata", f"{path!r} is git metadata; refused")


def check_path(path: str, policy: PatchPolicy) -> None:
    """Raise PatchRefusal when a patch may not change ``path`` (every per-path rule above)."""
    _check_location(path)
    if {"inferloom", ".inferloom"} & set(PurePosixPath(path).parts):
        raise PatchRefusal("touches_inferloom", f"{path!r} is inferloom itself or its state; refused")
    for rule, pats, what in (("touches_entrypoint", policy.entrypoint, "the entrypoint"),
                             ("touches_quality_gate", policy.quality_gate, "the quality gate"),
                             ("touches_benchmark_inputs", policy.benchmark_inputs, "the benchmark inputs"),
                             ("touches_protected", policy.protected, "the protected files")):
        pat = matches(path, pats)
        if pat is not None:
            raise PatchRefusal(rule, f"{path!r} is part of {what} (spec pattern {pat!r}); "
                                     "no candidate may change how it is measured or judged")
    if matches(path, policy.allowlist) is None:
        raise PatchRefusal("outside_allowlist", f"{path!r} matches no allowlist pattern "
                                                f"({', '.join(policy.allowlist) or 'the allowlist is empty'}); "
                                                "add it to custom.patches.allowlist if it may change")


# adjacent string literals, optionally joined by '+': 'sub' + 'process' -> 'subprocess'
_JOIN = re.compile(r"""(['"])\s*(?:\+\s*)?(?:\\\n\s*)?\1""")


def _folded(text: str) -> str:
    prev = None
    while prev != text:
        prev, text = text, _JOIN.sub("", text)
    return text


def check_added_lines(added: Mapping[str | None, Sequence[str]], patterns: Sequence[str]) -> None:
    """Raise ``forbidden_pattern`` when an added line (``added``: path -> its
    added lines) matches a pattern, as written or folded (see the module
    docstring: a tripwire, not a boundary)."""
    for pat in patterns:
        rx = re.compile(pat)
        for path, lines in added.items():
            for line in lines:
                if rx.search(line) or rx.search(_folded(line)):
                    raise PatchRefusal("forbidden_pattern", f"an added line in {path!r} matches the forbidden "
                                                            f"pattern {pat!r}: {line.strip()[:120]!r}")
            joined = _folded("\n".join(lines))
            m = rx.search(joined)
            if m is not None:
                raise PatchRefusal("forbidden_pattern", f"the added lines of {path!r} match the forbidden pattern "
                                                        f"{pat!r} once string literals are joined: "
                                                        f"{m.group(0)[:120]!r}")


def check_policy(patch: ParsedPatch, policy: PatchPolicy, tree: Path | None = None) -> None:
    """Raise PatchRefusal with the first rule ``patch`` breaks; return None when it passes."""
    for f in patch.files:
        for path in f.paths:
            _check_location(path)
        for mode in (f.old_mode, f.new_mode):
            if mode is not None and mode.startswith("120"):
                raise PatchRefusal("symlink_created", f"{'/'.join(f.paths)}: file mode {mode} is a symbolic link; "
                                                      "a patch may not create, change or remove links")
        for path in f.paths:
            check_path(path, policy)
    added: dict[str | None, list[str]] = {}
    for f in patch.files:
        added.setdefault(f.new_path, []).extend(f.added)
    check_added_lines(added, policy.forbidden_patterns)
    if tree is not None:
        root = Path(tree)
        for path in patch.paths:
            cur = root
            for part in PurePosixPath(path).parts:
                cur = cur / part
                if cur.is_symlink():
                    raise PatchRefusal("symlink_followed", f"{path!r} goes through the symbolic link "
                                                           f"{cur.relative_to(root)}; refused")
