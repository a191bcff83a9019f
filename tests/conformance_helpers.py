"""Finds the implementations of a Protocol in src/inferloom by their shape
(AST, nothing imported), so a conformance suite can fail when a new
implementation is not registered in it."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "inferloom"


def classes_with(*methods: str, without: tuple[str, ...] = ()) -> set[str]:
    """``module:Class`` for every class under src/inferloom that defines all of
    ``methods`` and none of ``without``, and is not itself a Protocol."""
    out = set()
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
            defined = {f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
            if "Protocol" not in bases and set(methods) <= defined and not defined & set(without):
                mod = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
                out.add(f"{mod}:{node.name}")
    return out


def qualname(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"
