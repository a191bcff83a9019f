"""Phases as peers (issue 29), checked on the source alone (AST, through benchmarks/import_graph.py):

* every module of src/inferloom/phases is either a phase's (one phase may span several modules:
  ``kernel`` and ``kernel_*``; a custom workload's phases are ``custom`` and ``custom_*``), shared
  infrastructure every phase may import, or the coordinator's wiring;
* no phase module imports a module of another phase (what one phase needs of another goes
  through the coordinator: the budget split, phases/budget.py; the strategy, ``ctx.strategy``);
* shared modules import no phase module (a phase reached through a shared helper is still a sibling);
* no phase or shared module imports the wiring (the wiring imports the phases, not the reverse).
"""


import pytest
from test_architecture import G  # the import-graph tool, loaded once (as test_layers does)

# a phase: its name and the module-name prefix of its other modules (``kernel`` -> ``kernel_llm``)
PHASES = ("prelude", "enablement", "framework", "kernel", "sweep", "close", "custom")

# module -> why every phase may import it
SHARED = {
    "context": "the SessionContext every phase step receives",
    "trial": "proposal -> measurement -> verdict, the one step every measuring phase shares",
    "common": "idempotency keys, seed blocks, JSON-safe values, the agents' view",
    "allowlist": "each phase's allowlist of actions and the proposal validation",
    "roofline": "the profile / roofline ledger kinds and a stack's roofline (PRELUDE, trials, KERNEL, CLOSE)",
    "audit": "the platform audit's ledger entry (PRELUDE and CLOSE)",
    "backend_choice": "which kernel backend the KERNEL phase runs (KERNEL, PRELUDE's server profile, the budget split)",
    "server_profile": "a server's own profile: whether to take one and taking it (PRELUDE for stock, KERNEL for the stack)",
}

# the coordinator's own modules: they import the phases and wire them
WIRING = {
    "coordinator": "the run loop and the phase table",
    "runner": "start / resume a session directory",
    "strategy": "which phase steps a workload runs, composed",
    "budget": "the budget split between phases",
}

PREFIX = "inferloom.phases."


def _phase_of(name: str) -> str | None:
    return next((p for p in PHASES if name == p or name.startswith(p + "_")), None)


def _modules() -> list[str]:
    return sorted(m[len(PREFIX):] for m in G.module_files() if m.startswith(PREFIX))


def _edges() -> list[tuple[str, str, str]]:
    """(importer, imported, where) among phases/ modules: module-level and function-local imports."""
    out = []
    for i in G.module_imports() + G.local_imports():
        if i.importer.startswith(PREFIX) and i.target.startswith(PREFIX):
            where = f"src/inferloom/phases/{i.path.name}:{i.line}"
            out.append((i.importer[len(PREFIX):], i.target[len(PREFIX):], where))
    return sorted(set(out))


def test_every_phases_module_is_a_phase_shared_or_wiring():
    mods = _modules()
    assert "kernel_trial" in mods and "custom_close" in mods  # the listing is real
    unplaced = [m for m in mods if _phase_of(m) is None and m not in SHARED and m not in WIRING]
    both = [m for m in mods if _phase_of(m) is not None and (m in SHARED or m in WIRING)]
    assert not unplaced, (f"phases/ modules that are neither a phase's nor in SHARED / WIRING (place them, "
                          f"with the reason): {unplaced}")
    assert not both, f"modules both a phase's and shared / wiring: {both}"
    stale = sorted((set(SHARED) | set(WIRING)) - set(mods))
    assert not stale, f"SHARED / WIRING name modules that are gone: {stale}"


def test_no_phase_imports_another_phase():
    edges = _edges()
    assert any(_phase_of(a) == "kernel" and b == "kernel_trial" for a, b, _ in edges)  # the graph is read
    bad = [f"{w}: {a} ({_phase_of(a)}) imports {b} ({_phase_of(b)})" for a, b, w in edges
           if _phase_of(a) and _phase_of(b) and _phase_of(a) != _phase_of(b)]
    if bad:
        pytest.fail("a phase imports another phase (route it through the coordinator, or move the shared "
                    "helper into a shared module):\n  " + "\n  ".join(bad), pytrace=False)


def test_shared_modules_import_no_phase():
    bad = [f"{w}: {a} imports {b} ({_phase_of(b)})" for a, b, w in _edges() if a in SHARED and _phase_of(b)]
    if bad:
        pytest.fail("a shared module imports a phase:\n  " + "\n  ".join(bad), pytrace=False)


def test_nothing_but_the_wiring_imports_the_wiring():
    bad = [f"{w}: {a} imports {b}" for a, b, w in _edges() if b in WIRING and a not in WIRING]
    if bad:
        pytest.fail("a phase or shared module imports the coordinator's wiring:\n  " + "\n  ".join(bad),
                    pytrace=False)
