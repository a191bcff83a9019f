"""Priors for vLLM on a GPU, ranked from the workload's roofline (agents/server_priors.py)."""

from __future__ import annotations

import pytest

from inferloom.agents.rules import RuleOrchestrator
from inferloom.agents.server_priors import decode_shares, default_table, server_priors
from inferloom.workloads.vllm_knobs import vllm_knobs

H200 = {"model": "llama-3.1-8b", "dtype": "bfloat16", "concurrency": 64, "input_len": 256, "output_len": 128}


def test_decode_of_the_8b_shape_at_c64_is_weight_dominated_and_fp8_weights_rank_first():
    s = decode_shares(H200)
    assert s["weights"] == pytest.approx(0.83, abs=0.01) and s["kv_cache"] == pytest.approx(0.15, abs=0.01)
    ps = server_priors(H200)
    assert ps[0].name == "fp8-weights" and dict(ps[0].changes) == {"quantization": "fp8"}
    assert ps[0].predicted_gain == pytest.approx(0.71, abs=0.01) and "83%" in ps[0].rationale
    assert [p.rank for p in ps] == sorted(p.rank for p in ps)
    assert [p.predicted_gain for p in ps] == sorted((p.predicted_gain for p in ps), reverse=True)


def test_stock_near_its_ceiling_ranks_overhead_levers_down_and_long_context_ranks_kv_fp8_first():
    near = {p.name: p for p in server_priors(H200, stock_fraction=0.95)}
    far = {p.name: p for p in server_priors(H200, stock_fraction=0.5)}
    assert near["async-scheduling"].predicted_gain < far["async-scheduling"].predicted_gain
    assert near["async-scheduling"].rank > near["fp8-kv-cache"].rank
    long_ctx = server_priors({**H200, "concurrency": 256, "input_len": 8192, "output_len": 256})
    assert long_ctx[0].name == "fp8-kv-cache"
    assert server_priors({**H200, "model": "/no/such/model"}) == []


def _state(knobs, fraction=None):
    stock = {k.name: k.default for k in knobs}
    extra = {"roofline_stock": {"fraction": fraction}} if fraction is not None else {}
    return {"device": "cuda", "knobs": [k.to_dict() for k in knobs], "stock_config": stock, "stack": stock,
            "trials": [], "workload": H200, "extra": extra}


def test_the_orchestrator_proposes_fp8_weights_first_for_vllm_on_a_gpu_and_nothing_changes_elsewhere():
    knobs = vllm_knobs(64)
    p = RuleOrchestrator().propose(_state(knobs, 0.70))
    assert p["action"] == "try_config" and p["changes"] == {"quantization": "fp8"} and p["source"] == "prior"
    assert "fp8-weights" in p["rationale"]
    # the same knob space on cpu: no server prior applies (quantization is CUDA-only)
    cpu = {**_state(knobs), "device": "cpu"}
    assert RuleOrchestrator().propose(cpu).get("changes", {}).get("quantization") is None
    # a knob space without vLLM's knobs keeps the defaults
    assert default_table({"compile_mode"}, H200, {}) is None
    assert default_table({"quantization"}, H200, {"extra": {"roofline_stock": {"fraction": "x"}}})[0].name == \
        "fp8-weights"


def test_sglang_gets_the_same_roofline_priors_in_its_own_values():
    from inferloom.workloads.sglang_knobs import sglang_knobs

    knobs = sglang_knobs(64)
    by = {k.name: k for k in knobs}
    table = {p.name: p for p in default_table(by, H200, {})}
    assert dict(table["fp8-kv-cache"].changes) == {"kv_cache_dtype": "fp8_e4m3"}  # SGLang has no plain fp8
    vllm = {p.name: p for p in default_table({k.name: k for k in vllm_knobs(64)}, H200, {})}
    assert dict(vllm["fp8-kv-cache"].changes) == {"kv_cache_dtype": "fp8"}  # vLLM's value, as before
    p = RuleOrchestrator().propose(_state(knobs, 0.70))
    assert p["action"] == "try_config" and p["changes"] == {"quantization": "fp8"} and "fp8-weights" in p["rationale"]


def test_an_moe_model_gets_the_tuned_fused_moe_configs_prior_and_a_dense_one_does_not(tmp_path, monkeypatch):
    from inferloom.spec.model import resolve_model

    monkeypatch.setenv("INFERLOOM_CACHE", str(tmp_path))
    olmoe = {**H200, "model": resolve_model("olmoe-1b-7b")}
    moe = {p.name: p for p in server_priors(olmoe)}
    assert dict(moe["tuned-moe-configs"].changes) == {"moe_configs": "tuned"}
    assert 0 < moe["tuned-moe-configs"].predicted_gain < moe["fp8-weights"].predicted_gain
    assert "tuned-moe-configs" not in {p.name for p in server_priors(H200)}
    # the experts' other kernels, one prior per engine's knob; none for a dense model
    assert dict(moe["flashinfer-moe-experts"].changes) == {"moe_backend": "flashinfer_cutlass"}
    assert dict(moe["flashinfer-moe-runner"].changes) == {"moe_runner_backend": "flashinfer_cutlass"}
    assert moe["flashinfer-moe-experts"].predicted_gain < moe["tuned-moe-configs"].predicted_gain
    assert not {"flashinfer-moe-experts", "flashinfer-moe-runner"} & {p.name for p in server_priors(H200)}
