"""Profile categories and roofline arithmetic.

The roofline numbers are checked against /work/shared/FACTS.md (measured on
one H200): Llama-3.1-8B shape, bf16, batch 64, 256 in / 128 out: weights
16.06 GB, KV cache 128 KiB per token, decode-step floor ~4.6 ms at 4.11 TB/s,
decode-only ceiling ~14,681 tok/s at 4.3 TB/s. The profile runs once on the
real llama-tiny engine on CPU (small traffic).
"""

from __future__ import annotations

import json
import math

import pytest

from inferloom.measure.ceilings import measure_ceilings
from inferloom.measure.costs import mean_decode_context, model_shape, step_costs
from inferloom.measure.op_categories import CATEGORIES, CATEGORY_PATTERNS, attribute, categorize
from inferloom.measure.roofline import amdahl_check, amdahl_limit, roofline

# ------------------------------------------------------------- categorize
CASES = [
    # GEMM: ops and kernels
    ("aten::linear", "gemm"),
    ("aten::addmm", "gemm"),
    ("aten::mm", "gemm"),
    ("aten::bmm", "gemm"),
    ("aten::matmul", "gemm"),
    ("nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_TNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_tn", "gemm"),
    ("gemv2T_kernel_val<int, int, __nv_bfloat16>", "gemm"),
    ("triton_tem_fused_mm_0", "gemm"),
    # attention (before GEMM: attention kernels carry cutlass / gemm-like names)
    ("aten::scaled_dot_product_attention", "attention"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("aten::_efficient_attention_forward", "attention"),
    ("flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", "attention"),
    ("aten::_softmax", "attention"),
    ("module::LlamaAttention", "attention"),
    # normalization
    ("aten::rms_norm", "normalization"),
    ("aten::layer_norm", "normalization"),
    ("aten::native_layer_norm", "normalization"),
    ("aten::rsqrt", "normalization"),
    ("module::LlamaRMSNorm", "normalization"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "normalization"),
    # memory copy
    ("aten::copy_", "memory_copy"),
    ("aten::_to_copy", "memory_copy"),
    ("aten::to", "memory_copy"),
    ("aten::cat", "memory_copy"),
    ("aten::index_copy_", "memory_copy"),
    ("aten::contiguous", "memory_copy"),
    ("Memcpy DtoD (Device -> Device)", "memory_copy"),
    ("Memset (Device)", "memory_copy"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 4, 64, 64>", "memory_copy"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)", "memory_copy"),
    # elementwise / activation
    ("aten::silu", "elementwise"),
    ("aten::mul", "elementwise"),
    ("aten::add_", "elementwise"),
    ("aten::gelu", "elementwise"),
    ("aten::pow", "elementwise"),
    ("aten::exp", "elementwise"),
    ("aten::argmax", "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel>", "elementwise"),
    ("triton_poi_fused__to_copy_mul_silu_1", "elementwise"),
    # MoE layers: the experts' GEMMs and their routing (vLLM 0.26's kernels; "softmax" is not attention here)
    ("fused_moe_kernel", "gemm"),
    ("void vllm::moe::topkGatingSoftmax<float, 8, 64, 4, 16, int>", "elementwise"),
    ("void vllm::moe::moeSoftmax<256>", "elementwise"),
    ("void vllm::moe::moeTopK<256>", "elementwise"),
    ("void vllm::moe::moe_align_block_size_kernel<int>", "elementwise"),
    ("void vllm::moe::moe_sum_kernel<c10::BFloat16, 8>", "elementwise"),
    ("vllm::moe::count_and_sort_expert_tokens_kernel", "elementwise"),
    # communication
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication"),
    ("c10d::allreduce_", "communication"),
    ("aten::all_gather_into_tensor", "communication"),
    # nothing matches
    ("aten::view", "other"),
    ("aten::expand", "other"),
    ("aten::topk", "other"),
    ("aten::max_pool2d", "other"),
    ("module::LlamaMLP", "other"),
    ("", "other"),
]


@pytest.mark.parametrize("name,expected", CASES)
def test_categorize_table(name, expected):
    assert categorize(name) == expected


def test_categorize_is_case_insensitive_and_table_driven():
    assert categorize("ATEN::LINEAR") == "gemm"
    cats = {c for c, _ in CATEGORY_PATTERNS}
    assert cats <= set(CATEGORIES) - {"other", "idle"}
    assert all(pats for _, pats in CATEGORY_PATTERNS)


def test_attribute_rules():
    # pointwise ops inside a norm module are normalization
    assert attribute(None, ["aten::pow"], ["module::LlamaRMSNorm", "module::LlamaDecoderLayer"]) == "normalization"
    # kernel under a norm op
    assert attribute("vectorized_elementwise_kernel<mul>", ["aten::mul", "aten::rms_norm"]) == "normalization"
    # the outermost op owns its inner copies and GEMMs
    assert attribute("direct_copy_kernel", ["aten::copy_", "aten::scaled_dot_product_attention"]) == "attention"
    assert attribute("nvjet_sm90", ["aten::mm", "aten::linear"], ["module::LlamaAttention"]) == "gemm"
    # eager attention: bare matmul / softmax / RoPE inside the attention module
    assert attribute(None, ["aten::matmul"], ["module::LlamaAttention"]) == "attention"
    assert attribute(None, ["aten::mul"], ["module::LlamaAttention"]) == "attention"
    # the KV-cache update stays a copy
    assert attribute(None, ["aten::cat"], ["module::LlamaAttention"]) == "memory_copy"
    # an unnamed wrapper (compiled region) defers to the kernel, then inner ops
    assert attribute("triton_poi_fused_add_0", ["Torch-Compiled Region: 0/0"]) == "elementwise"
    assert attribute(None, ["aten::addmm", "CompiledFunction"]) == "gemm"
    # no context at all
    assert attribute("nvjet_x", []) == "gemm"
    assert attribute(None, []) == "other"
    # MLP is not a scope: silu stays elementwise
    assert attribute(None, ["aten::silu"], ["module::LlamaMLP"]) == "elementwise"


# ------------------------------------------------------------- profile_run
TRAFFIC_KW = dict(concurrency=2, input_len=16, output_len=8, num_prompts=4)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from inferloom.spec import Traffic, WorkloadSpec
    from inferloom.workloads.transformers_engine import TransformersEngine

    mp = pytest.MonkeyPatch()
    mp.setenv("INFERLOOM_CACHE", str(tmp_path_factory.mktemp("inferloom-cache")))
    eng = TransformersEngine(WorkloadSpec(model="llama-tiny", device="cpu", traffic=Traffic(**TRAFFIC_KW)))
    h = eng.prepare({})
    yield eng, h
    eng.close()
    mp.undo()


@pytest.mark.slow
def test_profile_run_on_llama_tiny(tiny):
    from inferloom.measure.profile import profile_run

    eng, h = tiny
    before = eng.run(h, 11)
    assert before.success, before.error
    prof = profile_run(eng, h, 99)
    after = eng.run(h, 11)

    json.dumps(prof)  # JSON-able
    assert prof["run"]["success"], prof["run"]
    assert prof["device"] == "cpu" and prof["activities"] == ["cpu"]
    assert prof["torch_version"] and prof["profiler"]
    cats = prof["categories"]
    assert list(cats) == list(CATEGORIES)
    assert math.isclose(sum(c["share"] for c in cats.values()), 1.0, abs_tol=0.02)
    assert all(c["share"] >= 0 and c["seconds"] >= 0 for c in cats.values())
    assert cats["gemm"]["share"] > 0.05, cats
    assert cats["attention"]["share"] > 0
    assert cats["normalization"]["share"] > 0  # RMSNorm's pow/mean/rsqrt, through the module labels
    assert prof["module_labels"] is True
    assert 0 < prof["device_busy_s"] <= prof["wall_s"]
    assert prof["top_ops"] and prof["top_ops"][0]["category"] in CATEGORIES
    assert any(o["category"] == "gemm" for o in prof["top_ops"])
    # the profile never touches the next timed run: same tokens, no hooks left
    assert after.success, after.error
    assert after.output_tokens == before.output_tokens == 4 * 8
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in h.model.modules())


# ------------------------------------------------------------------ ceilings
def test_measure_ceilings_cpu():
    c = measure_ceilings("cpu")
    json.dumps(c)
    for key in ("memory_bandwidth_bytes_per_s", "matmul_flops_per_s"):
        assert c[key] > 0 and math.isfinite(c[key])
    assert c["device"] == "cpu" and c["device_name"] and c["date"] and c["measured_at"]
    assert c["bandwidth"]["bytes_per_copy"] >= 64 << 20  # beyond caches
    assert c["matmul_dtype"] == "float32"


# ------------------------------------------------------------------ step costs
H200_BW = 4.11e12  # FACTS.md: device-to-device copy, bytes read + written
H200_MM = 740e12  # FACTS.md: bf16 8192^3 matmul


def test_step_costs_reproduce_facts_8b():
    ctx = mean_decode_context(256, 128)
    assert ctx == 320.0
    c = step_costs("llama-3.1-8b", 64, ctx, 2, input_len=256)
    m = c["model"]
    assert m["parameters"] == 8_030_261_248  # Llama-3.1-8B
    assert m["weight_bytes"] == pytest.approx(16.06e9, rel=0.005)  # FACTS: 16.06 GB in bf16
    assert m["kv_bytes_per_token"] == 128 * 1024  # FACTS: 128 KiB per token
    step = c["decode_step"]
    assert step["bytes_breakdown"]["kv_cache_read"] == 64 * 320 * 128 * 1024
    floor_ms = step["bytes"] / H200_BW * 1e3
    assert floor_ms == pytest.approx(4.6, rel=0.10)  # FACTS: decode-step floor 4.6 ms
    assert step["flops"] / H200_MM < step["bytes"] / H200_BW  # decode is bandwidth-bound
    pre = c["prefill"]
    assert pre["flops"] / H200_MM > pre["bytes"] / H200_BW  # prefill of 64 x 256 is compute-bound
    # prefill matmul FLOPs: 2 * tokens * (non-embedding matmul params) + last-position LM head
    assert pre["flops_breakdown"]["matmul"] == pytest.approx(
        2 * 64 * 256 * (m["matmul_params"] - 128256 * 4096) + 2 * 64 * 4096 * 128256
    )


def test_roofline_reproduces_facts_ceiling():
    c = step_costs("llama-3.1-8b", 64, 320, 2, input_len=256)
    ceil = {"memory_bandwidth_bytes_per_s": 4.3e12, "matmul_flops_per_s": H200_MM}
    r = roofline(ceil, c, 2792.0, 64, 128, 256)
    assert r["decode_only_ceiling_tok_per_s"] == pytest.approx(14681, rel=0.10)  # FACTS table, batch 64
    assert r["decode_step"]["bound"] == "memory" and r["prefill"]["bound"] == "compute"
    # the end-to-end ceiling counts the prefill, like the measured metric
    assert r["ceiling_tok_per_s"] < r["decode_only_ceiling_tok_per_s"]
    assert r["floor_s"] >= max(r["bandwidth_floor_s"], r["compute_floor_s"]) - 1e-12
    assert r["floor_s"] == pytest.approx(r["prefill"]["floor_s"] + 127 * r["decode_step"]["floor_s"])
    # stock at batch 64 (FACTS: 2,792 tok/s) sits at ~19% of the decode-only ceiling
    assert r["decode_only_fraction"] == pytest.approx(0.19, abs=0.03)
    assert 0 < r["fraction"] <= 1 and not r["suspect"]
    assert r["headroom"] == pytest.approx(1 / r["fraction"])
    b1 = roofline(ceil, step_costs("llama-3.1-8b", 1, 320, 2), 48.6, 1, 128, 256)
    assert b1["decode_only_ceiling_tok_per_s"] == pytest.approx(267, rel=0.10)  # FACTS table, batch 1
    json.dumps(r)


def test_roofline_flags_faster_than_the_hardware():
    c = step_costs("llama-3.1-8b", 64, 320, 2, input_len=256)
    ceil = {"memory_bandwidth_bytes_per_s": H200_BW, "matmul_flops_per_s": H200_MM}
    ok = roofline(ceil, c, 3459.0, 64, 128, 256)  # FACTS: static cache
    assert 0 < ok["fraction"] <= 1 and not ok["suspect"]
    bad = roofline(ceil, c, 2 * ok["ceiling_tok_per_s"], 64, 128, 256)
    assert bad["fraction"] > 1 and bad["suspect"] and "reason" in bad
    none = roofline(ceil, c, None, 64, 128, 256)
    assert none["fraction"] is None and not none["suspect"] and none["ceiling_tok_per_s"] > 0


def test_model_shape_sources_agree():
    from inferloom.models.presets import PRESETS, model_info, preset_config

    info = model_info("llama-tiny", dtype="float32")
    a = model_shape("llama-tiny")
    assert model_shape(info) == a == model_shape(PRESETS["llama-tiny"]) == model_shape(preset_config("llama-tiny"))
    # the shape formula counts exactly the parameters the built module has
    c = step_costs(info, 2, 20, 4)
    assert c["model"]["parameters"] == info["parameters"]
    assert c["model"]["weight_bytes"] == info["weight_bytes"]
    assert step_costs("llama-tiny", 2, 20, "bfloat16")["dtype_bytes"] == 2


# ------------------------------------------------------------------ Amdahl
def test_amdahl_limit():
    assert amdahl_limit(0.5) == pytest.approx(2.0)
    assert amdahl_limit(0.5, 2.0) == pytest.approx(1 / 0.75)
    assert amdahl_limit(0.0, 10) == pytest.approx(1.0)
    assert amdahl_limit(1.0) == math.inf
    with pytest.raises(ValueError):
        amdahl_limit(1.5)


def test_amdahl_check_cases():
    ok = amdahl_check(1.3, 2.0)
    assert ok["verdict"] == "ok" and not ok["suspect"] and ok["margin"] == pytest.approx(0.65)
    within_noise = amdahl_check(2.05, 2.0)  # inside the 5% tolerance
    assert not within_noise["suspect"]
    bad = amdahl_check(2.5, 2.0)
    assert bad["suspect"] and bad["verdict"] == "suspect" and "reason" in bad
    # a change touching 30% of the profiled time cannot give 1.6x (limit 1/0.7 = 1.43x)
    assert amdahl_check(1.6, amdahl_limit(0.3))["suspect"]
    assert amdahl_check(1.4, amdahl_limit(0.3))["verdict"] == "ok"
    unknown = amdahl_check(3.0, None)
    assert unknown["verdict"] == "unbounded" and not unknown["suspect"]
    assert amdahl_check(3.0, math.inf)["verdict"] == "unbounded"
    with pytest.raises(ValueError):
        amdahl_check(0.0, 2.0)


def test_device_kernels_are_tied_to_their_ops_and_annotations_ignored():
    """The CUDA path on synthetic profiler events (no GPU needed): kernels
    attributed through linked_correlation_id to their op and module labels,
    mirrored GPU annotations and sync records not counted as busy time."""
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType

    from inferloom.measure.trace_analysis import device_units, summarize

    def ev(name, start, end, dev=DeviceType.CPU, id=0, linked=0, parent=None, ann=False):
        return NS(name=name, time_range=NS(start=start, end=end), device_type=dev, id=id,
                  linked_correlation_id=linked, cpu_parent=parent, is_async=False,
                  is_user_annotation=ann, activity_type=None)

    cuda = DeviceType.CUDA
    root = ev("inferloom::profile_run", 0, 100, ann=True)
    norm = ev("module::LlamaRMSNorm", 1, 10, parent=root, ann=True)
    pow_op = ev("aten::pow", 2, 3, id=7, parent=norm)
    lin = ev("aten::linear", 11, 20, id=8, parent=root)
    launch = ev("cudaLaunchKernel", 12, 13, id=901, linked=8, parent=lin)
    events = [
        root, norm, pow_op, lin, launch,
        ev("inferloom::profile_run", 0, 100, dev=cuda, ann=True),  # GPU mirror of the label
        ev("module::LlamaRMSNorm", 5, 10, dev=cuda, ann=True),
        ev("void at::native::vectorized_elementwise_kernel<pow>", 5, 10, dev=cuda, id=900, linked=7),
        ev("nvjet_sm90_tst_128x256", 20, 50, dev=cuda, id=901, linked=8),
        ev("nvjet_sm90_tst_128x256", 40, 60, dev=cuda, id=902, linked=8),  # overlaps (second stream)
        ev("Stream Sync", 60, 90, dev=cuda, id=903),
        ev("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 95, 130, dev=cuda, id=904),  # clipped at 100
    ]
    units, busy = device_units(events, (0.0, 100.0))
    by_cat = {}
    for _, cat, us in units:
        by_cat[cat] = by_cat.get(cat, 0.0) + us
    assert by_cat == {"normalization": 5.0, "gemm": 50.0, "communication": 5.0}
    assert busy == 5.0 + 40.0 + 5.0  # union: [5,10] + [20,60] + [95,100]
    cats, top = summarize(units, 100.0, busy, top_n=3)
    assert math.isclose(sum(c["share"] for c in cats.values()), 1.0)
    assert cats["idle"]["share"] == pytest.approx(0.5)
    assert top[0]["name"].startswith("nvjet") and top[0]["category"] == "gemm" and top[0]["count"] == 2


def test_ceilings_cached_in_the_kb_come_back_with_an_iso_date(tmp_path):
    # seen on the H200: the second session printed the cached date as epoch seconds
    import datetime as dt
    from types import SimpleNamespace

    from inferloom.kb import RecipeStore
    from inferloom.phases.prelude import _ceilings, _device_name
    from inferloom.session.state_models import SessionExtra

    url = f"sqlite:///{tmp_path / 'kb.sqlite'}"
    with RecipeStore(url) as store:
        store.put_ceiling(_device_name("cpu"), mem_bw_bytes_per_s=1e10, matmul_flops_per_s=1e11, dtype="float32")
    c = SimpleNamespace(kb_url=url, spec=SimpleNamespace(dtype="float32"), progress=lambda m: None)
    st = SimpleNamespace(device="cpu", extra=SessionExtra())
    got = _ceilings(c, st)
    assert got["cached"] is True and got["memory_bandwidth_bytes_per_s"] == 1e10
    assert st.extra.ceilings is not None and st.extra.ceilings.model_dump() == got
    when = dt.datetime.fromisoformat(got["measured_at"])
    assert when.tzinfo is not None and abs((dt.datetime.now(dt.timezone.utc) - when).total_seconds()) < 600


@pytest.mark.slow
def test_a_compiled_graphs_own_time_is_inductors_fused_code_not_other(tiny):
    # on CPU a compiled stack's fused loops run inside "## Call CompiledFxGraph ... ##" (its library
    # calls, aten::mm and the like, are its children): that own time is elementwise work, not "other"
    from inferloom.measure.profile import profile_run

    eng, _ = tiny
    h = eng.prepare({"compile_mode": "default"})
    try:
        assert eng.run(h, 1).success  # compiles
        prof = profile_run(eng, h, 2)
    finally:
        eng.release(h)
    graphs = [o for o in prof["top_ops"] if "CompiledFxGraph" in o["name"]]
    assert graphs and all(o["category"] == "elementwise" for o in graphs)
    assert prof["categories"]["elementwise"]["share"] >= sum(o["share"] for o in graphs) - 1e-9
    assert prof["categories"]["gemm"]["share"] > 0  # the graph's aten::mm calls, counted on their own


def test_the_roofline_places_only_output_tok_s_of_fixed_length_traffic(tmp_path):
    """A goodput objective (requests/s within SLOs) or a trace (its own lengths and arrivals) is not what the
    roofline bounds: roofline_skip says why, and roofline_for places nothing (no fraction in other units)."""
    from types import SimpleNamespace

    from inferloom.phases.roofline import roofline_for, roofline_skip
    from inferloom.spec import load_spec

    tok = load_spec(None, {"framework": "synthetic", "model": "llama-tiny"})
    assert roofline_skip(tok) is None
    good = SimpleNamespace(framework="vllm", diffusion=None, objective="goodput", traffic=SimpleNamespace(trace=None))
    assert "goodput" in roofline_skip(good) and "output tok/s" in roofline_skip(good)
    traced = SimpleNamespace(diffusion=None, objective="output_tokens_per_s", traffic=SimpleNamespace(trace="t.jsonl"))
    assert "trace" in roofline_skip(traced)
    ceil = SimpleNamespace(model_dump=lambda: {"hbm_bytes_per_s": 1e12, "flops_per_s": 1e14})
    st = SimpleNamespace(extra=SimpleNamespace(ceilings=ceil))
    assert roofline_for(SimpleNamespace(spec=good), st, 12.0, {}) is None
