"""The optional adapter hooks (Protocols in inferloom.workloads.base): every
adapter class that has any of a hook's members satisfies the whole hook, so an
``isinstance`` check at a call site never misses a half-implemented hook."""

import inspect
import typing

import pytest

from inferloom.spec import load_spec
from inferloom.workloads import base
from inferloom.workloads.base import OPTIONAL_HOOKS


def _members(proto: type) -> set[str]:
    attrs = getattr(proto, "__protocol_attrs__", None)
    return set(attrs) if attrs is not None else set(typing._get_protocol_attrs(proto))  # Python 3.11


def _synthetic(_tmp):
    from inferloom.workloads.synthetic import SyntheticAdapter

    return SyntheticAdapter()


def _transformers(_tmp):
    from inferloom.workloads.transformers_engine import TransformersEngine

    return TransformersEngine(load_spec(None, {"model": "llama-tiny", "device": "cpu"}))


def _custom(tmp):
    from custom_helpers import tiny_custom_spec
    from inferloom.workloads.custom import CustomAdapter

    return CustomAdapter(tiny_custom_spec(tmp))


def _diffusers(_tmp):
    from inferloom.workloads.diffusers_engine import DiffusersEngine

    return DiffusersEngine(load_spec(None, {"framework": "diffusers", "model": "sd3-tiny", "device": "cpu"}))


def _vllm(_tmp):
    from inferloom.workloads.vllm_adapter import VLLMAdapter

    return VLLMAdapter(load_spec(None, {"framework": "vllm", "model": "llama-tiny", "device": "cpu"}))


# which hooks each adapter offers today (a new hook on an adapter updates this table)
EXPECTED = {
    "synthetic": {"DeclaredProfile"},
    "transformers": {"GreedyLogprobs", "CrossKnobRules"},
    "custom": {"OwnQualityGate", "OwnObjective", "SourceTrees"},
    "vllm": {"ServerLogs", "RejectedFlags", "RecoveryOptions", "ApproximateScores", "ServerReuse", "BatchedProbes",
             "AAQuality", "CrossKnobRules", "ServerRuns", "EnginePatches", "EngineTables", "SourceRungs",
             "BudgetedStarts"},
    "diffusers": {"OwnObjective", "ImageOutputs", "CrossKnobRules"},
}


@pytest.mark.parametrize("make", [_synthetic, _transformers, _custom, _vllm, _diffusers], ids=list(EXPECTED))
def test_an_adapter_with_any_member_of_a_hook_satisfies_the_hook(make, tmp_path, request):
    adapter = make(tmp_path)
    try:
        offered = set()
        for hook in OPTIONAL_HOOKS:
            members = _members(hook)
            present = {m for m in members if hasattr(adapter, m)}
            if present:
                assert isinstance(adapter, hook), f"{type(adapter).__name__} has {sorted(present)} of {hook.__name__} " \
                                                  f"but not {sorted(members - present)}"
                for m in members:
                    if inspect.isfunction(getattr(hook, m, None)):
                        assert callable(getattr(adapter, m)), f"{type(adapter).__name__}.{m} is not callable"
                offered.add(hook.__name__)
        assert offered == EXPECTED[request.node.callspec.id]
    finally:
        adapter.close()


def test_every_hook_is_a_runtime_checkable_protocol_with_a_contract():
    assert len(OPTIONAL_HOOKS) == 19
    for hook in OPTIONAL_HOOKS:
        assert getattr(hook, "_is_runtime_protocol", False), hook
        assert hook.__doc__ and len(hook.__doc__) > 40, hook
        assert hook.__name__ in base.__all__


def test_the_engine_tells_the_default_orchestrator_its_cross_knob_rules():
    """CrossKnobRules: the engine refuses prompt_lookup with micro_batch > 1 before anything runs, and the
    session's default orchestrator gets that rule (so such a configuration never costs a trial)."""
    from inferloom.phases.runner import default_agents
    from inferloom.workloads.transformers_engine import TransformersEngine

    spec = load_spec(None, {"model": "llama-tiny", "device": "cpu"})
    engine = TransformersEngine(spec)
    try:
        assert engine.config_refusal({}) is None
        why = engine.config_refusal({"prompt_lookup": 3, "micro_batch": 4})
        assert why and "micro_batch=1" in why
        feasible = default_agents(spec, adapter=engine).orchestrator.feasible
        assert feasible({"prompt_lookup": 3, "micro_batch": 1}) and not feasible({"prompt_lookup": 3, "micro_batch": 4})
    finally:
        engine.close()


def _stock_aa(tmp_path, adapter):
    from test_session import SPEC, agents

    from inferloom.phases.runner import start
    from inferloom.session import ledger as L

    d = tmp_path / type(adapter).__name__
    start(d, SPEC, budget_minutes=10, max_trials=1, adapter=adapter, agents=agents(), sweep=False, kb_url=None)
    return next(e for e in L.read_entries(d, L.MEASUREMENT) if e.get("action") == "measure_stock")


def test_aa_quality_is_the_adapter_s_capability_not_its_framework_name(tmp_path):
    """AAQuality: PRELUDE's A/A measures the quality contract on the sets the adapter names (a server whose
    outputs vary between identical instances), whatever the spec's framework; without the hook, speed only."""
    from inferloom.workloads.quality_hooks import AAQuality
    from inferloom.workloads.synthetic import SyntheticAdapter

    class Varying(SyntheticAdapter):
        aa_quality_sets = ("eval",)

    assert isinstance(Varying(), AAQuality) and not isinstance(SyntheticAdapter(), AAQuality)
    plain = _stock_aa(tmp_path, SyntheticAdapter())
    assert not (plain.get("quality") or {}).get("sets")
    varying = _stock_aa(tmp_path, Varying())
    assert [s["set_name"] for s in varying["quality"]["sets"]] == ["eval"]
