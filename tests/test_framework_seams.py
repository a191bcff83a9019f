"""One place per framework (inferloom.frameworks): no framework-name tests outside the adapters and the spec.

* no module outside ``inferloom/workloads/``, ``inferloom/spec/`` and ``inferloom/frameworks.py`` compares
  an expression that mentions ``framework`` with a framework's name (``==``, ``!=``, ``in``, ``not in``,
  ``match``); it asks the framework's descriptor instead (:data:`ALLOWED`: the few exceptions, with reasons);
* every descriptor's lazy targets import, and the descriptors are the frameworks the spec accepts;
* the lazy targets, counted as imports of the module that resolves them (``workloads.registry``), close no
  import cycle (the import graph's table detection sees a dict of strings, not the descriptors).
"""

import ast
import importlib
import importlib.util
import sys
import typing
from pathlib import Path

import pytest

from inferloom.frameworks import FRAMEWORKS, Framework, UnknownFramework, described, framework
from inferloom.errors import InferloomError
from inferloom.spec import WorkloadSpec
from inferloom.workloads.registry import make_adapter, stack_precision
from inferloom.workloads.vllm_knobs import stack_precision as vllm_precision

PKG = Path(__file__).resolve().parents[1] / "src" / "inferloom"
EXEMPT_DIRS = ("workloads/", "spec/")
EXEMPT_FILES = {"frameworks.py"}
NAMES = frozenset(FRAMEWORKS)

# (file under src/inferloom) -> why it may compare a framework's name (at most 3).
ALLOWED: dict[str, str] = {}


def _names_in(node: ast.AST) -> bool:
    """``node`` is a framework name, or a tuple / list / set literal holding one."""
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(isinstance(e, ast.Constant) and e.value in NAMES for e in node.elts)
    return False


def _pattern_names(p: ast.pattern) -> bool:
    if isinstance(p, ast.MatchValue):
        return _names_in(p.value)
    if isinstance(p, ast.MatchOr):
        return any(_pattern_names(q) for q in p.patterns)
    if isinstance(p, ast.MatchAs) and p.pattern is not None:
        return _pattern_names(p.pattern)
    return False


def _mentions_framework(node: ast.AST) -> bool:
    return "framework" in ast.unparse(node).lower()


def name_tests(source: str, filename: str = "<src>") -> list[int]:
    """The lines of ``source`` that compare an expression mentioning ``framework`` with a framework's name."""
    lines = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op, a, b in zip(node.ops, operands, operands[1:]):
                if not isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                    continue
                if (_names_in(b) and _mentions_framework(a)) or (_names_in(a) and _mentions_framework(b)):
                    lines.append(node.lineno)
                    break
        elif isinstance(node, ast.Match) and _mentions_framework(node.subject):
            lines += [c.pattern.lineno for c in node.cases if _pattern_names(c.pattern)]
    return sorted(set(lines))


def _scanned() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel in EXEMPT_FILES or rel.startswith(EXEMPT_DIRS):
            continue
        out.append((rel, path))
    return out


def test_the_scan_finds_each_kind_of_name_test():
    src = ("if spec.framework == 'vllm': pass\n"
           "if workload.get('framework') not in ('transformers', 'diffusers'): pass\n"
           "x = 'synthetic' != framework\n"
           "match ctx.spec.framework:\n    case 'custom' | 'other':\n        pass\n"
           "if name == 'vllm' or kind in ('custom',): pass\n"  # not about a framework: left alone
           "if spec.framework == 'tensorrt_llm': pass\n")  # not a framework (yet)
    assert name_tests(src) == [1, 2, 3, 5]


def test_no_framework_name_tests_outside_the_adapters_and_the_spec():
    assert len(ALLOWED) <= 3, "at most 3 allowed framework-name tests"
    found = [f"src/inferloom/{rel}:{line}" for rel, path in _scanned() if rel not in ALLOWED
             for line in name_tests(path.read_text(), str(path))]
    if found:
        pytest.fail(f"{len(found)} framework-name test(s) outside workloads/ and spec/ (ask the descriptor, "
                    "inferloom.frameworks.framework(name), instead):\n" + "\n".join(found), pytrace=False)


def test_the_allowlist_has_no_stale_entries():
    files = dict(_scanned())
    stale = [rel for rel in ALLOWED if rel not in files or not name_tests(files[rel].read_text())]
    assert not stale, f"ALLOWED entries no longer needed (remove them): {stale}"
    assert all(reason.strip() for reason in ALLOWED.values()), "each allowed entry needs its reason"


def _target(target: str):
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_each_descriptor_names_targets_that_import(name):
    f = FRAMEWORKS[name]
    assert isinstance(f, Framework) and f.name == name
    assert callable(_target(f.adapter)), f"{name}: adapter {f.adapter} is not callable"
    if f.stack_precision is not None:
        assert callable(_target(f.stack_precision)), f"{name}: stack_precision {f.stack_precision}"
    if f.version_module is not None:
        assert importlib.util.find_spec(f.version_module) is not None, f"{name}: no module {f.version_module}"
    assert f.strategy in ("config", "image", "custom")
    assert set(f.preflight) <= {"model_dir", "pipeline_dir", "server_env", "source_repo", "chat_prompts"}


def test_the_descriptors_are_the_frameworks_the_spec_accepts():
    accepted = set(typing.get_args(WorkloadSpec.model_fields["framework"].annotation))
    assert accepted == set(FRAMEWORKS), (f"spec accepts {sorted(accepted)}, descriptors for {sorted(FRAMEWORKS)}: "
                                         "add the missing entries (inferloom/frameworks.py or spec/workload.py)")


def test_an_unknown_framework_is_a_clear_inferloom_error():
    with pytest.raises(UnknownFramework, match="framework 'tensorrt_llm'.*expected one of custom, diffusers"):
        framework("tensorrt_llm")
    assert issubclass(UnknownFramework, InferloomError) and issubclass(UnknownFramework, ValueError)
    assert described("tensorrt_llm") is None and described(None) is None
    assert described("vllm") is framework("vllm")


def test_the_roofline_precision_is_the_frameworks_own():
    cfg = {"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3", "dtype": "auto"}
    assert stack_precision(framework("vllm"), cfg, "bfloat16") == vllm_precision(cfg, "bfloat16")
    assert stack_precision(framework("transformers"), cfg, "bfloat16") is None  # the config's dtype sets the bytes
    with pytest.raises(UnknownFramework):
        make_adapter(type("Spec", (), {"framework": "tensorrt_llm"})())


def _load_graph_tool():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "import_graph.py"
    spec = importlib.util.spec_from_file_location("inferloom_import_graph_seams", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_lazy_targets_close_no_import_cycle():
    G = _load_graph_tool()
    graph = G.module_graph(with_local=True)
    resolver = "inferloom.workloads.registry"
    for f in FRAMEWORKS.values():
        for target in (f.adapter, f.stack_precision):
            if target is not None:
                module = target.partition(":")[0]
                assert module in graph, f"{f.name}: {module} is not an inferloom module"
                graph[resolver].add(module)
    assert "inferloom.frameworks" in graph
    assert graph["inferloom.frameworks"] <= {"inferloom.errors"}, "frameworks.py is pure data: it imports only errors"
    comps = G.cycles(graph)
    assert not comps, "import cycle through a framework's lazy target: " + " -> ".join(G.one_cycle(graph, comps[0]))
