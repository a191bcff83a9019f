"""One layer per folder, checked over the source alone (AST; nothing is imported).

* the kernel library (``inferloom.kernels``, its catalog included) is below the engines: it imports nothing
  from ``workloads``, ``measure``, ``phases``, ``agents``, ``evidence`` or ``commands`` (the delivery of a
  kernel into an engine is the engine's: ``workloads/engine_*.py``);
* ``inferloom.measure`` imports no phase and no adapter: of ``workloads`` only ``workloads.base`` (the
  Protocols, ``RunRecord``, ``Knob``); a caller passes the adapter it measures;
* the bench job (``inferloom.bench``), the evidence code (``inferloom.evidence``) and the engine choice
  (``inferloom.engine_choice``) import nothing from ``inferloom.phases`` (the paired comparison they use is
  ``measure/compare.py``).

Every import counts: module-level ones, function-local ones and those made by name through a module-level
table (``benchmarks/import_graph.py``'s functions, as ``tests/test_architecture.py`` uses them).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable, NamedTuple

import pytest

from test_architecture import G

ROOT = G.ROOT


def _under(module: str, package: str) -> bool:
    name = f"{ROOT}.{package}"
    return module == name or module.startswith(name + ".")


class Rule(NamedTuple):
    id: str
    name: str
    importer: Callable[[str], bool]  # the modules the rule binds
    forbidden: Callable[[str], bool]  # the modules they may not import


KERNELS_BELOW = ("workloads", "measure", "phases", "agents", "evidence", "commands")
RULES = (
    Rule("kernels", "the kernel library imports nothing above it (" + ", ".join(KERNELS_BELOW) + ")",
         lambda m: _under(m, "kernels"), lambda t: any(_under(t, p) for p in KERNELS_BELOW)),
    Rule("measure", "measure/ imports no phase and, of workloads/, only workloads.base",
         lambda m: _under(m, "measure"),
         lambda t: _under(t, "phases") or (_under(t, "workloads") and t != f"{ROOT}.workloads.base")),
    Rule("bench-evidence", "the bench job, evidence/ and engine_choice/ import nothing from phases/",
         lambda m: m == f"{ROOT}.bench" or _under(m, "evidence") or _under(m, "engine_choice"),
         lambda t: _under(t, "phases")),
)


# (importer, target) -> why the import may cross the layer for now; every entry must still be needed
ALLOWED: dict[tuple[str, str], str] = {
    (f"{ROOT}.measure.quality", f"{ROOT}.workloads.prompts"):
        "prompt sources (seeded token ids, JSONL texts): a pure helper, no adapter; it belongs below workloads/ "
        "(e.g. models/prompts.py), moved once the open work on prompts.py (traffic.prompts texts for vLLM) is in",
}


@functools.lru_cache(maxsize=None)
def _all_imports(src: Path = G.SRC) -> tuple:
    return tuple(G.module_imports(src) + G.local_imports(src) + G.table_imports(src))


def violations(src: Path = G.SRC) -> list[str]:
    """``file:line: importer imports target (rule)`` for every import that breaks a rule, sorted."""
    pkg = src / ROOT
    out = set()
    for imp in _all_imports(src):
        for rule in RULES:
            if rule.importer(imp.importer) and rule.forbidden(imp.target) and (imp.importer, imp.target) not in ALLOWED:
                out.add(f"src/{ROOT}/{imp.path.relative_to(pkg).as_posix()}:{imp.line}: {imp.importer} imports "
                        f"{imp.target} (rule: {rule.name})")
    return sorted(out)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_layer_rule(rule):
    broken = [v for v in violations() if v.endswith(f"(rule: {rule.name})")]
    if broken:
        pytest.fail(f"{len(broken)} import(s) across a layer:\n" + "\n".join(broken), pytrace=False)


def test_every_allowed_crossing_is_still_needed():
    used = {(i.importer, i.target) for i in _all_imports()}
    stale = sorted(set(ALLOWED) - used)
    assert not stale, f"ALLOWED entries no longer needed (remove them): {stale}"


def test_the_rules_see_a_violation_at_every_kind_of_import(tmp_path):
    """The check is not vacuous: a kernel module importing an engine (at module level, in a function, by a
    table), measure importing a concrete adapter, evidence importing a phase: each is named with its line."""
    pkg = tmp_path / ROOT
    files = {
        "__init__.py": "", "bench.py": "", "kernels/__init__.py": "", "measure/__init__.py": "",
        "workloads/__init__.py": "", "workloads/base.py": "", "workloads/vllm_adapter.py": "",
        "phases/__init__.py": "", "phases/kernel.py": "", "evidence/__init__.py": "",
        "kernels/up.py": f"from {ROOT}.workloads.base import Knob\n",
        "kernels/lazy.py": f"def f():\n    from {ROOT}.measure import costs\n",
        "kernels/table.py": f"T = {{'x': '{ROOT}.phases.kernel:run'}}\n",
        "measure/ok.py": f"from {ROOT}.workloads.base import RunRecord\n",
        "measure/bad.py": f"\nfrom {ROOT}.workloads.vllm_adapter import VLLMAdapter\n",
        "evidence/bad.py": f"from {ROOT}.phases import kernel\n",
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    found = violations(tmp_path)
    where = sorted(v.split(": ", 1)[0] for v in found)
    assert where == [f"src/{ROOT}/evidence/bad.py:1", f"src/{ROOT}/kernels/lazy.py:2", f"src/{ROOT}/kernels/table.py:1",
                     f"src/{ROOT}/kernels/up.py:1", f"src/{ROOT}/measure/bad.py:2"], found
    assert all("(rule: " in v for v in found)
