"""Architecture checks over the source alone (AST and file sizes; nothing is imported).

* no import cycle among inferloom's modules;
* no module under src/inferloom over 400 lines;
* no function-local import of an inferloom module, except the few an optional
  dependency requires (``ALLOWED_LOCAL``, each with its reason).

The import graph is the one ``benchmarks/import_graph.py`` prints (same
functions): module-level imports, those inside module-level ``try`` / ``if``
blocks included, ``if TYPE_CHECKING:`` blocks left out; ``from inferloom.x
import y`` is an import of ``inferloom.x.y`` when ``y`` is a submodule; a
package import is an import of its ``__init__``. The cycle check counts every
dependency, also those imported later: the function-local imports (those in
``ALLOWED_LOCAL`` too: a lazy import still is a dependency) and the modules a
module imports by name through a table (the CLI's ``COMMANDS``, the adapter
registry's ``ADAPTERS``).
"""

import importlib.util
import sys
from pathlib import Path

import pytest

MAX_LINES = 400

# (file under src/inferloom, the inferloom module it imports inside a function) -> why that import
# can't be at module level. Only an optional dependency is a reason: the importer must import without it.
_TRITON = "needs triton (an optional dependency: the test extra); the importer must import without it"
ALLOWED_LOCAL: dict[tuple[str, str], str] = {
    ("workloads/engine_attention.py", "inferloom.kernels.catalog.ops"): _TRITON + " (attention_kernel=triton_decode only)",
    ("workloads/engine_gate_up.py", "inferloom.kernels.catalog.ops"): _TRITON + " (mlp_kernel=triton_gate_up_silu only)",
    ("workloads/diffusers_ops.py", "inferloom.kernels.catalog.rmsnorm"): _TRITON + " (rmsnorm_impl=triton only)",
    ("phases/kernel_llm.py", "inferloom.kernels.catalog.index"):
        _TRITON + " (the entry the LLM kernel author writes for, reached only when the role plays)",
    ("kernels/catalog_backend.py", "inferloom.kernels.catalog.index"):
        _TRITON + " (the entries, reached once unavailable() found triton; kernels.registry imports the backend)",
}


def _load_graph_tool():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "import_graph.py"
    spec = importlib.util.spec_from_file_location("inferloom_import_graph", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod


G = _load_graph_tool()
PKG = G.SRC / G.ROOT


def _rel(path: Path) -> str:
    return path.relative_to(PKG).as_posix()


def _unallowed_local_imports() -> list:
    return [i for i in G.local_imports() if (_rel(i.path), i.target) not in ALLOWED_LOCAL]


def test_no_import_cycle():
    graph = G.module_graph(with_local=True)
    comps = G.cycles(graph)
    if comps:
        pytest.fail(f"{len(comps)} import cycle(s); the largest, {len(comps[0])} modules: "
                    + " -> ".join(G.one_cycle(graph, comps[0]))
                    + "".join(f"\n  cycle of {len(c)}: {', '.join(c)}" for c in comps), pytrace=False)


def test_no_module_over_400_lines():
    long = sorted(((len(p.read_text().splitlines()), _rel(p)) for p in PKG.rglob("*.py")), reverse=True)
    over = [f"{name} ({n} lines)" for n, name in long if n > MAX_LINES]
    if over:
        pytest.fail(f"{len(over)} module(s) over {MAX_LINES} lines: " + ", ".join(over), pytrace=False)


def test_no_function_local_imports_of_inferloom_modules():
    stmts = sorted({(_rel(i.path), i.line, i.target) for i in _unallowed_local_imports()})
    where: dict[tuple[str, int], list[str]] = {}
    for path, line, target in stmts:
        where.setdefault((path, line), []).append(target)
    listed = "\n".join(f"  src/inferloom/{p}:{n}: {', '.join(t)}" for (p, n), t in sorted(where.items()))
    if where:
        pytest.fail(f"{len(where)} function-local import(s) of inferloom modules (move them to module level, "
                       f"or add them to ALLOWED_LOCAL with the optional dependency that requires them):\n{listed}", pytrace=False)


def test_the_local_import_allowlist_has_no_stale_entries():
    used = {(_rel(i.path), i.target) for i in G.local_imports()}
    stale = sorted(set(ALLOWED_LOCAL) - used)
    if stale:
        pytest.fail(f"ALLOWED_LOCAL entries no longer needed (remove them): {stale}", pytrace=False)
