"""WorkloadStrategy conformance: every strategy implements the Protocol's
members with its signatures, and the spec picks exactly one."""

import inspect

import pytest

from inferloom.phases import strategy as S
from inferloom.phases.context import WorkloadStrategy
from inferloom.spec import load_spec

STRATEGIES = [S.ConfigStrategy, S.CustomStrategy, S.ImageStrategy, S.EnginePatchStrategy]
METHODS = ("bind", "framework_step", "close_measure")


def test_every_strategy_in_the_module_is_listed():
    found = {obj for _n, obj in inspect.getmembers(S, inspect.isclass)
             if obj.__module__ == S.__name__ and all(hasattr(obj, m) for m in METHODS)}
    assert found == set(STRATEGIES)


@pytest.mark.parametrize("cls", STRATEGIES, ids=lambda c: c.__name__)
class TestWorkloadStrategy:
    def test_attributes(self, cls):
        s = cls()
        assert isinstance(s.name, str) and s.name
        assert s.sweep_skip_reason is None or (isinstance(s.sweep_skip_reason, str) and s.sweep_skip_reason)

    @pytest.mark.parametrize("method", METHODS)
    def test_method_signature_matches_the_protocol(self, cls, method):
        want = [p.name for p in inspect.signature(getattr(WorkloadStrategy, method)).parameters.values()]
        got = [p.name for p in inspect.signature(getattr(cls, method)).parameters.values()]
        assert got == want, f"{cls.__name__}.{method}{got} != WorkloadStrategy.{method}{want}"


def test_the_spec_picks_the_strategy():
    assert isinstance(S.strategy_for(load_spec(None, {"framework": "synthetic"})), S.ConfigStrategy)
    assert isinstance(S.strategy_for(load_spec(None, {"model": "llama-tiny"})), S.ConfigStrategy)
    custom = S.strategy_for(type("Spec", (), {"framework": "custom"})())
    assert isinstance(custom, S.CustomStrategy) and custom.sweep_skip_reason
    image = S.strategy_for(load_spec(None, {"framework": "diffusers", "model": "sd3-tiny"}))
    assert isinstance(image, S.ImageStrategy) and "no traffic grid" in image.sweep_skip_reason


def test_a_vllm_spec_with_engine_patches_picks_the_engine_patch_strategy(tmp_path):
    (tmp_path / "a.patch").write_text("Hypothesis: core.py\n--- a/vllm/v1/engine/core.py\n+++ b/vllm/v1/engine/core.py\n"
                                      "@@ -1 +1 @@\n-x\n+y\n")
    vllm = {"framework": "vllm", "model": "llama-tiny"}
    patched = S.strategy_for(load_spec(None, {**vllm, "serving.engine_patches": str(tmp_path)}))
    assert isinstance(patched, S.EnginePatchStrategy) and patched.sweep_skip_reason is None
    assert type(S.strategy_for(load_spec(None, vllm))) is S.ConfigStrategy
