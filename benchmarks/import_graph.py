"""inferloom's import graph from the source alone (AST, nothing is imported).

Prints the package-level dependency map: for each inferloom package (``agents``,
``kernels``, ``session``, ...; a top-level module such as ``spec`` or ``cli``
counts as its own package) the packages its modules import at module level,
with the number of module-to-module edges behind each arrow. Used for
docs/design.md; ``tests/test_architecture.py`` uses the same functions for its
import-cycle and function-local-import checks.

Module-level imports are those that run when the module is imported:
top-level ``import`` / ``from ... import`` statements, including those inside
module-level ``try`` / ``if`` / ``with`` blocks and class bodies, but not
inside ``if TYPE_CHECKING:`` blocks nor inside functions. ``from inferloom.x
import y`` counts as an import of ``inferloom.x.y`` when ``y`` is a submodule,
else of ``inferloom.x``; importing a package counts as importing its
``__init__``.

    .venv/bin/python benchmarks/import_graph.py            # package map
    .venv/bin/python benchmarks/import_graph.py --modules  # module-level edges, one a line
    .venv/bin/python benchmarks/import_graph.py --cycles   # strongly connected modules
    (any of them with --with-local: function-local imports and imports by
    name through a module-level table, such as the CLI's commands, count too)
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

__all__ = ["SRC", "ROOT", "Import", "module_files", "module_imports", "local_imports", "table_imports",
           "module_graph", "package_of", "package_graph", "cycles", "one_cycle", "main"]

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "inferloom"


@dataclass(frozen=True)
class Import:
    """One import of an inferloom module: who imports what, where."""

    importer: str
    target: str
    path: Path
    line: int


def module_files(src: Path = SRC, root: str = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``src/<root>``
    (a package is its ``__init__.py``)."""
    out: dict[str, Path] = {}
    for p in sorted((src / root).rglob("*.py")):
        parts = list(p.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from X import ...`` names (relative ones resolved)."""
    if not node.level:
        return node.module or ""
    pkg = module.split(".") if is_package else module.split(".")[:-1]
    pkg = pkg[:len(pkg) - (node.level - 1)]
    return ".".join(pkg + ([node.module] if node.module else []))


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str],
             root: str) -> Iterator[str]:
    """The inferloom modules one import statement imports."""
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.name == root or a.name.startswith(root + "."):
                yield a.name
        return
    base = _base(module, is_package, node)
    if not (base == root or base.startswith(root + ".")):
        return
    for a in node.names:
        sub = f"{base}.{a.name}"
        yield sub if sub in known else base


def _walk(body: list[ast.stmt], in_function: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement under ``body`` with whether it sits inside a
    function; ``if TYPE_CHECKING:`` bodies are left out (their ``else`` is not)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, in_function
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _walk(node.body, True)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _walk(node.orelse, in_function)
        else:  # if / try / with / for / while / class / match: every statement block it holds
            blocks = [getattr(node, f, []) for f in ("body", "orelse", "finalbody")]
            blocks += [h.body for h in getattr(node, "handlers", [])] + [c.body for c in getattr(node, "cases", [])]
            for block in blocks:
                yield from _walk(block, in_function)


def _imports(files: dict[str, Path], root: str, want_local: bool) -> list[Import]:
    known = set(files)
    out: list[Import] = []
    for mod, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_pkg = path.name == "__init__.py"
        for node, local in _walk(tree.body, False):
            if local != want_local:
                continue
            for target in _targets(node, mod, is_pkg, known, root):
                if target != mod:
                    out.append(Import(mod, target, path, node.lineno))
    return out


def module_imports(src: Path = SRC, root: str = ROOT) -> list[Import]:
    """Every module-level import of an inferloom module by an inferloom module."""
    return _imports(module_files(src, root), root, want_local=False)


def local_imports(src: Path = SRC, root: str = ROOT) -> list[Import]:
    """Every import of an inferloom module made inside a function (any depth)."""
    return _imports(module_files(src, root), root, want_local=True)


def table_imports(src: Path = SRC, root: str = ROOT) -> list[Import]:
    """The imports a module makes by name, through a module-level table: a dict
    literal assigned at module level whose values are all strings naming an
    inferloom module (``"inferloom.x.y"`` or ``"inferloom.x.y:attr"``), such as
    the CLI's command table or the adapter registry. They run later
    (``importlib.import_module``) but are dependencies all the same."""
    files = module_files(src, root)
    out: list[Import] = []
    for mod, path in files.items():
        for node in ast.parse(path.read_text(), filename=str(path)).body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if not isinstance(value, ast.Dict) or not value.values:
                continue
            names = [v.value.partition(":")[0] if isinstance(v, ast.Constant) and isinstance(v.value, str) else None
                     for v in value.values]
            if all(n in files for n in names):
                out += [Import(mod, n, path, v.lineno) for n, v in zip(names, value.values) if n != mod]
    return out


def module_graph(src: Path = SRC, root: str = ROOT, with_local: bool = False) -> dict[str, set[str]]:
    """Module -> the inferloom modules it imports at module level (every module
    a key); ``with_local``: function-local imports and imports by table
    (:func:`table_imports`) count too."""
    graph: dict[str, set[str]] = {m: set() for m in module_files(src, root)}
    lazy = local_imports(src, root) + table_imports(src, root) if with_local else []
    for imp in module_imports(src, root) + lazy:
        if imp.target in graph:
            graph[imp.importer].add(imp.target)
    return graph


def package_of(module: str, root: str = ROOT) -> str:
    """``inferloom.session.state`` -> ``session``; ``inferloom.spec`` -> ``spec``;
    ``inferloom`` -> ``inferloom``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph(src: Path = SRC, root: str = ROOT, with_local: bool = False) -> dict[str, Counter[str]]:
    """Package -> {package it imports: number of module edges}; edges inside a package are left out."""
    out: dict[str, Counter[str]] = {package_of(m, root): Counter() for m in module_files(src, root)}
    for a, targets in module_graph(src, root, with_local).items():
        for b in targets:
            pa, pb = package_of(a, root), package_of(b, root)
            if pa != pb:
                out[pa][pb] += 1
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan),
    each sorted, largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out, key=lambda c: (-len(c), c))


def one_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module, as a path that
    ends where it starts (breadth-first inside the component)."""
    members = set(component)
    start = component[0]
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return path[::-1] + [start]  # start, ..., v, start
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return [start]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, default=SRC, help="the src/ directory (default: this checkout's)")
    ap.add_argument("--modules", action="store_true", help="print module-level edges instead of the package map")
    ap.add_argument("--cycles", action="store_true", help="print the import cycles (strongly connected modules)")
    ap.add_argument("--with-local", action="store_true",
                    help="count function-local imports and imports by table (the CLI's commands, the adapters) too")
    args = ap.parse_args(argv)
    kind = "module-level, function-local and by-table imports" if args.with_local else "module-level imports"
    if args.modules:
        for a, targets in sorted(module_graph(args.src, with_local=args.with_local).items()):
            for b in sorted(targets):
                print(f"{a} -> {b}")
        return 0
    if args.cycles:
        graph = module_graph(args.src, with_local=args.with_local)
        comps = cycles(graph)
        for comp in comps:
            print(f"{len(comp)} modules: {', '.join(comp)}")
            print("  e.g. " + " -> ".join(one_cycle(graph, comp)))
        print("no import cycle" if not comps else f"{len(comps)} cycle(s)")
        return 1 if comps else 0
    pg = package_graph(args.src, with_local=args.with_local)
    width = max(len(p) for p in pg)
    print(f"inferloom package dependencies ({kind}; n = module edges), from {args.src}")
    for pkg in sorted(pg):
        deps = ", ".join(f"{d} ({n})" for d, n in sorted(pg[pkg].items())) or "-"
        print(f"{pkg:<{width}} -> {deps}")
    users = Counter(d for deps in pg.values() for d in deps)
    print("\nimported by (packages): " + ", ".join(f"{p} {users[p]}" for p in sorted(pg, key=lambda p: (-users[p], p))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
