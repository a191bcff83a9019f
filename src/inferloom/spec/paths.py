"""Where a spec's relative paths point: the folder of the spec file.

One rule for every command (``validate``, ``knobs``, ``bench``, ``optimize``;
``resume`` reads the resolved spec back from manifest.json): a relative path
written in a spec file is relative to **the folder of that file**, never to the
current directory, so a spec works from wherever inferloom is started. A path
given as a command-line flag (``--model``, ``--prompts``,
``--quality-prompts-file``), or in a spec given only by flags, is relative to
the current directory, as a shell user expects. ``~`` is expanded. The
resolved, absolute path is what the spec holds from then on, and so what the
manifest records.

The fields (:data:`SPEC_DIR_PATHS`):

* ``model`` (unless it names a preset or a real model: ``spec/model.py``; a
  ``.gguf`` file is resolved here like any path, and converted by the spec's
  validation), ``traffic.prompts`` (unless
  ``random``), ``traffic.trace``, ``quality.prompts_file``, ``custom.repo``,
  ``custom.patches.dir``, ``serving.engine_patches``, ``serving.wheelhouse``: files and directories;
* ``serving.python`` and the program of ``custom.patches.command`` (its first
  element): when they contain a ``/`` (a bare name such as ``python3`` is
  looked up on ``PATH``, as a shell does); a later element of
  ``custom.patches.command`` when it names an existing file next to the spec
  (the Specialist runs in a private temporary directory, where a relative
  path could name nothing).

Paths that name files **inside the checkout** stay relative to the checkout
(``custom.entrypoint``, ``custom.entrypoint_files``,
``custom.patches.quality_gate``, ``custom.patches.benchmark_inputs``,
``custom.patches.allowlist``): they are read in the copy of the checkout that
each candidate runs in. Symbolic links are kept as written (a virtual
environment's ``bin/python`` is a link that must stay one).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from inferloom.models.trained import TASK_SETS
from inferloom.spec.model import MODEL_NAMES

__all__ = ["SPEC_DIR_PATHS", "resolve_spec_paths", "resolve_path_value", "resolve_override", "absolute"]

#: dotted spec key -> how its value names a path: "path" (a file or directory),
#: "program" (a path when it contains a /, else a command on PATH), "command" (a
#: command line: its program, and any argument naming an existing file)
SPEC_DIR_PATHS: Mapping[str, str] = {
    "model": "path",
    "traffic.prompts": "path",
    "traffic.trace": "path",
    "quality.prompts_file": "path",
    "quality.task.file": "path",
    "diffusion.prompts_file": "path",
    "serving.python": "program",
    "serving.engine_patches": "path",
    "serving.wheelhouse": "path",
    "custom.repo": "path",
    "custom.patches.dir": "path",
    "custom.patches.command": "command",
}

# values that are names, not paths
_NOT_PATHS: Mapping[str, frozenset[str]] = {"model": MODEL_NAMES,
                                             "traffic.prompts": frozenset({"random"}),
                                             "quality.task.file": frozenset(TASK_SETS)}


def absolute(value: str, base: str | Path) -> str:
    """``value`` (``~`` expanded) made absolute against ``base``, normalised
    lexically (``..`` folded) with symbolic links kept."""
    return os.path.abspath(os.path.join(str(base), os.path.expanduser(value)))


def _program(value: str, base: str | Path) -> str:
    return absolute(value, base) if "/" in value or value.startswith("~") else value


def resolve_path_value(key: str, value: Any, base: str | Path) -> Any:
    """``value`` of the dotted spec key ``key`` with its relative paths made
    absolute against ``base`` (unchanged when ``key`` names no path, or the value
    is not the type that key takes: the spec's validation says so)."""
    kind = SPEC_DIR_PATHS.get(key)
    if kind is None or value is None:
        return value
    if kind == "command":
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            return value
        rest = [absolute(v, base) if v and not v.startswith("-") and not os.path.isabs(v)
                and os.path.isfile(absolute(v, base)) else v for v in value[1:]]
        return [_program(value[0], base), *rest]
    if not isinstance(value, str) or not value or value in _NOT_PATHS.get(key, ()):
        return value
    return _program(value, base) if kind == "program" else absolute(value, base)


def resolve_spec_paths(data: Mapping[str, Any], base: str | Path) -> dict[str, Any]:
    """A copy of the raw spec mapping ``data`` with every path field of
    :data:`SPEC_DIR_PATHS` resolved against ``base`` (the spec file's folder).
    Sections that are not mappings are left for validation to refuse."""
    out: dict[str, Any] = dict(data)
    for key in SPEC_DIR_PATHS:
        *parents, leaf = key.split(".")
        node: Any = out
        for p in parents:
            nxt = node.get(p) if isinstance(node, dict) else None
            if not isinstance(nxt, dict):
                node = None
                break
            nxt = dict(nxt)
            node[p] = nxt  # copied: the caller's mapping is never changed
            node = nxt
        if isinstance(node, dict) and leaf in node:
            node[leaf] = resolve_path_value(key, node[leaf], base)
    return out


def resolve_override(key: str, value: Any, base: str | Path) -> Any:
    """An override of the dotted key ``key`` (a flag's value, or a whole
    section) with its paths resolved against ``base`` (the current directory)."""
    parts = key.split(".")
    tree: Any = value
    for p in reversed(parts):
        tree = {p: tree}
    tree = resolve_spec_paths(tree, base)
    for p in parts:
        tree = tree[p]
    return tree
