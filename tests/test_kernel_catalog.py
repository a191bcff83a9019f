"""The kernel catalog's entries on CPU, through the Triton interpreter.

Each entry's correctness check (poisoned outputs, float64 reference, declared
tolerances) at small shapes in float32 and float16, and broken variants that
the check must refuse. bfloat16 and the fp8 entry only run on CUDA
(benchmarks/gpu_kernels.py).
"""

import importlib
import importlib.util
import json
import os
import sys

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from triton_helpers import interpreted_imports  # noqa: E402

with interpreted_imports():  # the catalog's kernels decorated for the interpreter (tests/triton_helpers.py)
    import torch  # noqa: E402
    import triton  # noqa: E402,F401

    from inferloom.kernels import catalog  # noqa: E402
    from inferloom.kernels.catalog import bench, index, tuning  # noqa: E402
    from inferloom.kernels.catalog import decode_attention as da  # noqa: E402
    from inferloom.kernels.catalog import mlp, rmsnorm  # noqa: E402
    from inferloom.kernels.catalog.entry import check  # noqa: E402

DTYPES = ["float32", "float16"]
SMALL_ATTN = {"batch": 4, "q_heads": 8, "kv_heads": 2, "head_dim": 32, "max_len": 96}
CFG_ATTN = {"chunk": 32, "block_n": 16, "num_warps": 4, "num_stages": 2}


@pytest.fixture(autouse=True)
def _tuning_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("INFERLOOM_KERNEL_CACHE", str(tmp_path / "kcache"))
    tuning._MEMO.clear()


# ---------------------------------------------------------------- decode attention

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [
    {"ragged": 1},                    # random lengths, row 0 of length 1, last row = max_len
    {"context": 1},                   # every row one token long
    {"context": 96},                  # every row fills the cache
    {"context": 50},                  # ends mid-tile and mid-chunk
    {"ragged": 1, "left_pad": 1},     # left-padded rows: [start, len)
], ids=["ragged", "len1", "full", "mid", "leftpad"])
def test_decode_attention_correct(dtype, case):
    r = check(da.ENTRY, {**SMALL_ATTN, **case}, dtype, "cpu", seed=7, config=CFG_ATTN)
    assert r.passed, r
    assert r.rel_l2 < da.ENTRY.tolerance(dtype)["rel_l2"]


@pytest.mark.parametrize("shape", [
    {"batch": 2, "q_heads": 4, "kv_heads": 4, "head_dim": 16, "max_len": 40, "ragged": 1},  # MHA, S not a multiple of chunk
    {"batch": 2, "q_heads": 8, "kv_heads": 1, "head_dim": 24, "max_len": 33, "ragged": 1},  # MQA, head_dim not a power of 2
], ids=["mha", "mqa-d24"])
def test_decode_attention_other_layouts(shape):
    r = check(da.ENTRY, shape, "float16", "cpu", seed=3, config=CFG_ATTN)
    assert r.passed, r


def test_decode_attention_default_config_and_one_split():
    # the default config (chunk 64) at a cache of 64 slots: a single split
    shape = {"batch": 2, "q_heads": 8, "kv_heads": 2, "head_dim": 32, "max_len": 64, "ragged": 1}
    assert check(da.ENTRY, shape, "float32", "cpu", seed=1).passed


def test_decode_attention_reads_no_padding():
    # make_inputs fills the cache outside [start, len) with NaN: a kernel that used it would
    # give NaN; the reference (which slices) does not
    inputs, out = da.ENTRY.make_inputs({**SMALL_ATTN, "ragged": 1, "left_pad": 1}, "float32", "cpu", 5)
    assert torch.isnan(inputs["k_cache"]).any() and torch.isnan(inputs["v_cache"]).any()
    da.decode_attention(**inputs, out=out, config=CFG_ATTN)
    assert torch.isfinite(out).all()
    assert torch.allclose(out.double(), da.decode_attention_reference(**inputs), rtol=1e-4, atol=1e-5)


def test_decode_attention_matches_sdpa_baseline():
    shape = {**SMALL_ATTN, "ragged": 1, "left_pad": 1, "poison_tail": 0}
    inputs, out = da.ENTRY.make_inputs(shape, "float32", "cpu", 11)
    da.decode_attention(**inputs, out=out, config=CFG_ATTN)
    for baseline in (da.sdpa_static_baseline, da.sdpa_gqa_baseline):
        assert torch.allclose(out, baseline(**inputs), rtol=1e-4, atol=1e-5)


def test_broken_attention_skipping_last_chunk_is_refused():
    def drop_last_chunk(q, k_cache, v_cache, seq_lens, starts=None, scale=None, *, out, config=None):
        n_splits = -(-k_cache.shape[2] // CFG_ATTN["chunk"])
        da.decode_attention(q, k_cache, v_cache, seq_lens, starts, scale, out=out, config=CFG_ATTN,
                            _merge_splits=n_splits - 1)

    r = check(da.ENTRY, {**SMALL_ATTN, "context": 96}, "float32", "cpu", seed=2, implementation=drop_last_chunk)
    assert not r.passed and r.rule in ("rel_l2", "max_rel"), r


def test_attention_that_leaves_a_row_unwritten_is_refused():
    def skip_last_row(q, k_cache, v_cache, seq_lens, starts=None, scale=None, *, out, config=None):
        da.decode_attention(q[:-1], k_cache[:-1], v_cache[:-1], seq_lens[:-1], None, scale,
                            out=out[:-1], config=CFG_ATTN)

    r = check(da.ENTRY, {**SMALL_ATTN, "ragged": 1}, "float32", "cpu", seed=2, implementation=skip_last_row)
    assert not r.passed and r.rule == "nan_output", r


def test_check_refuses_a_single_nan():
    def one_nan(x, residual, weight, eps=1e-5, *, out, config=None):
        rmsnorm.fused_add_rmsnorm(x, residual, weight, eps, out=out[0], residual_out=out[1])
        out[0].view(-1)[3] = float("nan")

    r = check(rmsnorm.ENTRY, {"tokens": 3, "hidden": 64}, "float32", "cpu", 0, implementation=one_nan)
    assert not r.passed and r.rule == "nan_output", r


# ---------------------------------------------------------------- fused add + RMSNorm

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [
    {"tokens": 5, "hidden": 256},
    {"tokens": 3, "hidden": 100},        # not a power of two: masked tail
    {"tokens": 2, "hidden": 64, "no_residual": 1},
], ids=["pow2", "h100", "no-res"])
def test_add_rmsnorm_correct(dtype, shape):
    r = check(rmsnorm.ENTRY, shape, dtype, "cpu", seed=4)
    assert r.passed, r


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rmsnorm_matches_hf_eager(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    inputs, _ = rmsnorm.ENTRY.make_inputs({"tokens": 4, "hidden": 128}, dtype, "cpu", 9)
    norm = LlamaRMSNorm(128, eps=1e-5).to(inputs["x"].dtype)
    norm.weight.data.copy_(inputs["weight"])
    h = inputs["residual"] + inputs["x"]
    want = norm(h)
    out, res = rmsnorm.fused_add_rmsnorm(inputs["x"], inputs["residual"], inputs["weight"], 1e-5)
    assert torch.equal(res, h)
    # the same rounding order as HF: equal up to float32 summation order (a dtype ulp at most)
    ulp = {"float32": 1e-5, "float16": 2e-3}[dtype]
    assert ((out.float() - want.float()).abs() <= ulp * want.float().abs().clamp(min=1)).all()


def test_add_rmsnorm_in_place_residual():
    inputs, _ = rmsnorm.ENTRY.make_inputs({"tokens": 3, "hidden": 64}, "float32", "cpu", 2)
    want_y, want_r = rmsnorm.rmsnorm_reference(**inputs)
    res = inputs["residual"].clone()
    y, r = rmsnorm.fused_add_rmsnorm(inputs["x"], res, inputs["weight"], 1e-5, residual_out=res)
    assert r.data_ptr() == res.data_ptr()
    assert torch.allclose(r.double(), want_r, atol=1e-6) and torch.allclose(y.double(), want_y, rtol=1e-5, atol=1e-6)


def test_broken_rmsnorm_without_the_residual_is_refused():
    def no_add(x, residual, weight, eps=1e-5, *, out, config=None):
        rmsnorm.fused_add_rmsnorm(x, None, weight, eps, out=out[0])
        out[1].copy_(x + residual)

    r = check(rmsnorm.ENTRY, {"tokens": 4, "hidden": 64}, "float32", "cpu", 1, implementation=no_add)
    assert not r.passed and r.rule == "rel_l2", r


def test_broken_rmsnorm_not_writing_the_residual_is_refused():
    def no_residual_out(x, residual, weight, eps=1e-5, *, out, config=None):
        tmp = torch.empty_like(x)
        rmsnorm.fused_add_rmsnorm(x, residual, weight, eps, out=out[0], residual_out=tmp)

    r = check(rmsnorm.ENTRY, {"tokens": 4, "hidden": 64}, "float32", "cpu", 1, implementation=no_residual_out)
    assert not r.passed and r.rule == "nan_output", r


# ---------------------------------------------------------------- MLP / projections

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [
    {"tokens": 4, "hidden": 64, "intermediate": 96},
    {"tokens": 19, "hidden": 80, "intermediate": 40},   # ragged M, K not a multiple of block_k
], ids=["small", "ragged"])
def test_gate_up_silu_correct(dtype, shape):
    cfg = {"block_m": 16, "block_n": 32, "block_k": 32, "num_warps": 4, "num_stages": 2}
    r = check(mlp.GATE_UP_ENTRY, shape, dtype, "cpu", seed=5, config=cfg)
    assert r.passed, r


def test_broken_gate_up_missing_last_k_block_is_refused():
    def short_k(x, w_gate_up, *, out, config=None):
        k = x.shape[1] - 16
        mlp.gate_up_silu(x[:, :k], w_gate_up[:, :k].contiguous(), out=out,
                         config={"block_m": 16, "block_n": 32, "block_k": 16, "num_warps": 4, "num_stages": 2})

    r = check(mlp.GATE_UP_ENTRY, {"tokens": 4, "hidden": 64, "intermediate": 32}, "float32", "cpu", 5,
              implementation=short_k)
    assert not r.passed and r.rule in ("rel_l2", "max_rel"), r


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_correct(dtype):
    r = check(mlp.SILU_MUL_ENTRY, {"tokens": 3, "intermediate": 200}, dtype, "cpu", seed=6,
              config={"block": 64, "num_warps": 4})
    assert r.passed, r


def test_silu_mul_with_swapped_halves_is_refused():
    def swapped(gu, *, out, config=None):
        n = gu.shape[1] // 2
        mlp.silu_mul(torch.cat([gu[:, n:], gu[:, :n]], 1), out=out)

    r = check(mlp.SILU_MUL_ENTRY, {"tokens": 3, "intermediate": 64}, "float32", "cpu", 6, implementation=swapped)
    assert not r.passed, r


@pytest.mark.parametrize("dtype", DTYPES)
def test_qkv_proj_correct_and_split_views(dtype):
    shape = {"tokens": 3, "hidden": 64, "q_heads": 4, "kv_heads": 2, "head_dim": 8}
    assert check(mlp.QKV_ENTRY, shape, dtype, "cpu", seed=8).passed
    inputs, out = mlp.QKV_ENTRY.make_inputs(shape, "float32", "cpu", 8)
    mlp.QKV_ENTRY.implementation(**inputs, out=out)
    q, k, v = mlp.split_qkv(out, inputs["q_dim"], inputs["kv_dim"])
    bq, bk, bv = mlp.QKV_ENTRY.baseline(**inputs)
    assert q.data_ptr() == out.data_ptr() and q.shape == bq.shape and v.shape == bv.shape
    for a, b in ((q, bq), (k, bk), (v, bv)):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def test_weight_helpers_refuse_mismatched_shapes():
    with pytest.raises(ValueError):
        mlp.concat_gate_up(torch.zeros(4, 8), torch.zeros(4, 6))
    with pytest.raises(ValueError):
        mlp.fuse_qkv_weights(torch.zeros(8, 8), torch.zeros(4, 8), torch.zeros(2, 8))


# ---------------------------------------------------------------- catalog, tuning, bench

def test_kernels_run_in_the_interpreter_and_env_is_restored():
    assert type(da._decode_attn_split_kernel).__name__ == "InterpretedFunction"
    assert type(triton.language.standard.sum).__name__ == "InterpretedFunction"
    assert os.environ.get("TRITON_INTERPRET") == "1"  # set by the fixture, restored after each test


def test_catalog_lists_entries_with_references_and_tolerances():
    names = [e.name for e in index.entries()]
    assert names[:3] == ["decode_attention", "add_rmsnorm", "gate_up_silu"]
    for e in index.entries():
        assert e.target_op and callable(e.reference) and callable(e.baseline)
        for dt in e.supported_dtypes:
            assert {"rel_l2", "max_rel"} <= set(e.tolerance(dt))
    fp8 = index.get("fp8_linear")
    assert fp8.unsupported("bfloat16", "cpu")  # CUDA sm_90 only
    assert index.get("decode_attention").unsupported("bfloat16", "cpu")  # interpreter gets bf16 wrong
    assert index.get("decode_attention").unsupported("float16", "cpu") is None


def test_workload_shapes_for_llama_8b():
    from inferloom.models.presets import PRESETS

    s = catalog.workload_shapes(PRESETS["llama-3.1-8b"], batch=64, context=320, cache_len=384)
    assert s["decode_attention"] == {"batch": 64, "q_heads": 32, "kv_heads": 8, "head_dim": 128,
                                     "max_len": 384, "context": 320}
    assert s["gate_up_silu"] == {"tokens": 64, "hidden": 4096, "intermediate": 14336}


def test_tuning_cache_is_per_device_and_shape(tmp_path):
    shape = {"batch": 1, "q_heads": 2, "kv_heads": 1, "head_dim": 16, "max_len": 8}
    # off CUDA: the default, nothing written
    assert tuning.lookup("decode_attention", "float16", shape, "cpu", {"chunk": 64}) == {"chunk": 64}
    tuning.store("decode_attention", "float16", shape, "cpu", {"chunk": 128}, 3.0)
    path = tuning.cache_path("cpu")
    assert path.parent == tmp_path / "kcache" / "kernel_tuning"
    data = json.loads(path.read_text())
    assert data[tuning.shape_key("decode_attention", "float16", shape)]["config"] == {"chunk": 128}
    # autotune does nothing off CUDA
    cfg, rows = tuning.autotune(da.ENTRY, shape, "float16", "cpu", lambda c: 1.0, lambda c: True)
    assert cfg == dict(da.DEFAULT_CONFIG) and rows == []


def test_autotune_picks_the_fastest_correct_config(monkeypatch):
    # the selection logic, with the device check bypassed and fake timings
    monkeypatch.setattr(tuning.torch, "device", lambda d: type("D", (), {"type": "cuda"})())
    monkeypatch.setattr(tuning, "store", lambda *a, **k: None)

    class E:
        name = "x"
        default_config = {"c": 0}
        tune_space = ({"c": 1}, {"c": 2}, {"c": 3}, {"c": 4})

    def time_config(cfg):
        if cfg["c"] == 4:
            raise RuntimeError("out of shared memory")
        return {1: 5.0, 2: 1.0, 3: 2.0}[cfg["c"]]

    best, rows = tuning.autotune(E, {}, "float16", "cuda", time_config, lambda cfg: cfg["c"] != 2)
    assert best == {"c": 3}  # 2 is faster but wrong
    assert len(rows) == 4 and "error" in rows[-1]


def test_bench_smoke_on_cpu():
    shape = {"tokens": 2, "hidden": 64}
    res = bench.bench_entry(rmsnorm.ENTRY, shape, "float32", "cpu", runs=3, warmup=1)
    assert res["impl_us"] > 0 and res["baseline_us"] > 0 and res["input_sets"] >= 2


@pytest.mark.parametrize("entry_name,shape", [
    ("decode_attention", {"batch": 2, "q_heads": 8, "kv_heads": 2, "head_dim": 16, "max_len": 160, "ragged": 1}),
    ("gate_up_silu", {"tokens": 3, "hidden": 256, "intermediate": 160}),
    ("silu_mul", {"tokens": 2, "intermediate": 300}),
    ("add_rmsnorm", {"tokens": 2, "hidden": 96}),
])
def test_every_tune_space_config_is_correct(entry_name, shape):
    # what the GPU autotune may pick must be right at any shape, not only fast
    entry = index.get(entry_name)
    for cfg in entry.tune_space:
        r = check(entry, shape, "float16", "cpu", seed=3, config=cfg)
        assert r.passed, (cfg, r)


def test_autotune_entry_checks_and_times_each_config(monkeypatch):
    seen = []

    def fake_autotune(entry, key, dtype, device, time_config, is_correct):
        for cfg in entry.tune_space[:2]:
            seen.append((dict(key), cfg, is_correct(cfg), time_config(cfg)))
        return dict(entry.tune_space[0]), []

    monkeypatch.setattr(bench.tuning, "autotune", fake_autotune)
    bench.autotune_entry(mlp.SILU_MUL_ENTRY, {"tokens": 2, "intermediate": 64}, "float32", "cpu", runs=2)
    assert len(seen) == 2 and all(ok and us > 0 for _, _, ok, us in seen)
    assert seen[0][0] == {"tokens": 2, "intermediate": 64}


def test_gpu_script_smoke(tmp_path, monkeypatch):
    import importlib.util
    from pathlib import Path

    monkeypatch.setattr(sys, "path", list(sys.path))

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_kernels.py"
    spec = importlib.util.spec_from_file_location("gpu_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "kernels.json"
    assert mod.main(["--smoke", "--out", str(out), "--entries", "decode_attention,add_rmsnorm,fp8_linear"]) == 0
    rep = json.loads(out.read_text())
    rows = {r["name"]: r for r in rep["entries"]}
    assert rows["decode_attention"]["passed"] and len(rows["decode_attention"]["checks"]) == 6
    assert rows["add_rmsnorm"]["impl_us"] > 0
    assert "skipped" in rows["fp8_linear"]
    hf_row = rep["hf_integration"]
    assert hf_row["passed"] and hf_row["tokens_equal_fraction"] == 1.0, hf_row


def test_custom_ops_compile_without_graph_breaks():
    from inferloom.kernels.catalog import ops

    a_in, _ = da.ENTRY.make_inputs({**SMALL_ATTN, "ragged": 1, "left_pad": 1}, "float32", "cpu", 3)
    r_in, _ = rmsnorm.ENTRY.make_inputs({"tokens": 4, "hidden": 64}, "float32", "cpu", 3)
    g_in, _ = mlp.GATE_UP_ENTRY.make_inputs({"tokens": 4, "hidden": 64, "intermediate": 32}, "float32", "cpu", 3)

    def step(a, r, g):
        att = ops.decode_attention(a["q"], a["k_cache"], a["v_cache"], a["seq_lens"], a["starts"])
        y, res = ops.add_rmsnorm(r["x"], r["residual"], r["weight"], 1e-5)
        h = ops.gate_up_silu(g["x"], g["w_gate_up"])
        h2 = ops.silu_mul(torch.cat([g["x"], g["x"]], dim=-1))
        return att, y, res, h, h2

    eager = step(a_in, r_in, g_in)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(a_in, r_in, g_in)
    for e, c in zip(eager, compiled):
        assert torch.equal(e, c)
    assert torch.allclose(eager[0].double(), da.decode_attention_reference(**a_in), rtol=1e-4, atol=1e-5)
    assert torch.allclose(eager[2].double(), rmsnorm.rmsnorm_reference(**r_in)[1], atol=1e-6)


def test_kernels_compile_for_sm90_at_the_8b_shape(tmp_path):
    # the interpreter checks logic only: compile each kernel (default configs) for Hopper ahead
    # of time, in a process without TRITON_INTERPRET, and check its shared memory fits
    import subprocess
    from pathlib import Path

    if not list(Path(triton.__file__).parent.glob("backends/nvidia/bin/ptxas*")):
        pytest.skip("this triton wheel carries no ptxas")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    out = tmp_path / "aot.json"
    proc = subprocess.run([sys.executable, "-m", "inferloom.kernels.catalog.aot", "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())
    assert {r["kernel"] for r in rows} == {"_decode_attn_split_kernel", "_decode_attn_merge_kernel", "_add_rmsnorm_kernel",
                                          "_gemm_gate_up_silu_kernel", "_silu_mul_kernel"}
    assert all(r["fits"] and "error" not in r for r in rows), rows
    gate_up = next(r for r in rows if r["kernel"] == "_gemm_gate_up_silu_kernel")
    assert gate_up["shared_bytes"] > 2 * (64 * 64 + 2 * 64 * 64) * 2  # software-pipelined (several stages)


def test_fp8_quantisation_error_sits_inside_the_declared_tolerance():
    # what the e4m3 GEMM computes, simulated in float64 on CPU: its error against the
    # unquantised product must pass the entry's tolerance with room to spare, and a
    # scale mix-up must not
    from inferloom.kernels.catalog import fp8
    from inferloom.kernels.catalog.entry import _errors

    inputs, _ = fp8.ENTRY.make_inputs({"tokens": 16, "in_features": 512, "out_features": 256}, "bfloat16", "cpu", 0)
    xq, xs = fp8.quantize_rows(inputs["x"])
    assert xq.dtype == torch.float8_e4m3fn and xs.shape == (16, 1)
    assert inputs["w_scale"].shape == (1, 256)
    w_deq = inputs["w_fp8"].double() * inputs["w_scale"].double().t()
    y = ((xq.double() * xs.double()) @ w_deq.t()).to(torch.bfloat16)
    ref = fp8.ENTRY.reference(**inputs)
    tol = fp8.ENTRY.tolerance("bfloat16")
    l2, mx = _errors(y, ref)
    assert l2 < tol["rel_l2"] / 1.5 and mx < tol["max_rel"]
    wrong = ((xq.double()) @ w_deq.t()).to(torch.bfloat16)  # activation scale forgotten
    assert _errors(wrong, ref)[0] > tol["rel_l2"]


def test_candidate_fields_follow_the_backend_calling_convention():
    f = da.ENTRY.candidate_fields("float32", ({**SMALL_ATTN, "context": 9},))
    assert f["id"] == "catalog:decode_attention" and f["tolerance"] == da.ENTRY.tolerance("float32")
    inputs, out = f["make_inputs"](f["shapes"][0], "float32", "cpu", 0)
    out.fill_(float("nan"))
    f["implementation"](**inputs, out=out)
    assert torch.allclose(out.double(), f["reference"](**inputs), rtol=1e-4, atol=1e-6)


def test_hf_attention_implementation_decodes_like_sdpa(monkeypatch):
    # a tiny Llama, left-padded batch, static cache, greedy: the engine's attention_kernel=triton_decode
    # (workloads/engine_attention.py) runs the kernel at every decode step of every layer and matches HF's SDPA
    from transformers import LlamaConfig, LlamaForCausalLM

    from inferloom.workloads import engine_attention as attention

    name = attention.register("triton_decode")
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=100, max_position_embeddings=128, pad_token_id=0,
                      bos_token_id=1, eos_token_id=2)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.tensor([[0, 0, 0, 5, 6, 7], [3, 4, 5, 6, 7, 8]])
    calls = []
    real = da.decode_attention
    monkeypatch.setattr(da, "decode_attention", lambda *a, **k: calls.append((a[3].tolist(), a[4].tolist())) or real(*a, **k))

    def generate(impl):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            return model.generate(input_ids=ids, attention_mask=(ids != 0).long(), max_new_tokens=5,
                                  min_new_tokens=5, do_sample=False, cache_implementation="static",
                                  output_scores=True, return_dict_in_generate=True)

    want, got = generate("sdpa"), generate(name)
    assert torch.equal(want.sequences, got.sequences)
    for a, b in zip(want.scores, got.scores):
        fin = torch.isfinite(a)
        assert torch.equal(fin, torch.isfinite(b)) and (a[fin] - b[fin]).abs().max() < 1e-4
    assert len(calls) == 4 * 2  # 4 decode steps (the first new token comes from prefill) x 2 layers
    # the real lengths (not the cache size) and the left padding of row 0
    assert calls[0] == ([7, 7], [3, 0]) and calls[-1] == ([10, 10], [3, 0])


def test_catalog_backend_candidate_passes_the_correctness_gate_and_a_broken_one_does_not():
    # the KERNEL phase's own gate (kernels/gates.py) over the catalog backend's proposal, on CPU
    import dataclasses

    from inferloom.kernels import gates
    from inferloom.kernels.base import Target
    from inferloom.kernels.catalog_backend import CatalogBackend

    workload = {"device": "cuda", "dtype": "float16", "model": "llama-tiny", "framework": "transformers",
                "batch": 3, "input_len": 20, "output_len": 12,
                "stack": {"cache_implementation": "static", "attn_implementation": "sdpa"}}
    (cand,) = CatalogBackend().propose([Target("attention", 0.4, True, "hot")], workload)
    assert cand.shapes[0]["max_len"] == 32 and cand.shapes[0]["context"] == 26
    ok = gates.correctness(cand, "cpu", seeds=(1,))
    assert ok.passed, ok.why

    def wrong_scale(q, k_cache, v_cache, seq_lens, starts=None, scale=None, *, out, config=None):
        da.decode_attention(q, k_cache, v_cache, seq_lens, starts, 1.5 * q.shape[-1] ** -0.5, out=out)

    broken = dataclasses.replace(cand, implementation=wrong_scale)
    bad = gates.correctness(broken, "cpu", seeds=(1,))
    assert not bad.passed and bad.rule == "kernel_incorrect", bad.why


def test_mlp_kernel_triton_gate_up_silu_matches_eager_in_a_tiny_llama(monkeypatch):
    # the engine's mlp_kernel=triton_gate_up_silu (CUDA in the engine; here apply_kernels on CPU under the
    # interpreter, float32): same logits as transformers' MLP, also compiled (the custom op keeps one graph)
    import copy

    from transformers import LlamaConfig, LlamaForCausalLM

    from inferloom.workloads.engine_kernels import apply_kernels

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=100, max_position_embeddings=128)
    eager = LlamaForCausalLM(cfg).eval()
    fused = copy.deepcopy(eager)
    notes = apply_kernels(fused, {"mlp_kernel": "triton_gate_up_silu"})
    assert notes["mlp_kernel"].startswith("triton_gate_up_silu: 2 MLP modules")
    calls = []
    real = mlp.gate_up_silu
    monkeypatch.setattr(mlp, "gate_up_silu", lambda *a, **k: calls.append(tuple(a[0].shape)) or real(*a, **k))
    ids = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = eager(ids, use_cache=False).logits
        got = fused(ids, use_cache=False).logits
        assert calls == [(14, 64)] * 2  # every layer, through the custom op, the batch's tokens flattened
        compiled = torch.compile(fused, fullgraph=True, backend="aot_eager")(ids, use_cache=False).logits
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert torch.allclose(compiled, want, rtol=1e-5, atol=1e-5)
    assert not hasattr(fused.model.layers[0].mlp, "gate_proj")  # the separate weights are released
    # a prefill-sized call (more tokens than the Triton GEMM is tuned for) goes to one cuBLAS GEMM instead
    from inferloom.workloads.engine_gate_up import TRITON_MAX_TOKENS

    calls.clear()
    long = torch.randint(0, 100, (1, TRITON_MAX_TOKENS + 1), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(fused(long, use_cache=False).logits, eager(long, use_cache=False).logits,
                              rtol=1e-5, atol=1e-5)
    assert calls == []


def test_catalog_backend_proposes_gate_up_silu_after_decode_attention():
    import dataclasses

    from inferloom.kernels import gates
    from inferloom.kernels.base import Target
    from inferloom.kernels.catalog_backend import NOT_SWITCHABLE, CatalogBackend

    be = CatalogBackend()
    assert {"attention", "gemm"} <= be.rewritable() and "gate_up_silu" not in NOT_SWITCHABLE
    workload = {"device": "cuda", "dtype": "float32", "model": "llama-tiny", "framework": "transformers",
                "batch": 3, "input_len": 20, "output_len": 12,
                "stack": {"cache_implementation": "static", "attn_implementation": "sdpa"}}
    both = [Target("gemm", 0.5, True, "hot"), Target("attention", 0.4, True, "hot")]
    assert [c.id for c in be.propose(both, workload)] == ["catalog-decode-attention", "catalog-gate-up-silu"]
    assert [c.id for c in be.propose(both[1:], workload)] == ["catalog-decode-attention"]
    assert [c.id for c in be.propose([Target("gemm", 0.5, False, "cold")], workload)] == []
    done = {**workload, "stack": {**workload["stack"], "mlp_kernel": "torch_gate_up"}}
    assert [c.id for c in be.propose(both, done)] == ["catalog-decode-attention"]
    cand = be.propose(both[:1], workload)[0]
    assert cand.target == "gemm" and cand.config_changes == {"mlp_kernel": "triton_gate_up_silu"}
    assert cand.shapes == ({"tokens": 3, "hidden": 256, "intermediate": 512},  # decode (llama-tiny)
                           {"tokens": 60, "hidden": 256, "intermediate": 512})  # prefill: batch x input_len
    ok = gates.correctness(cand, "cpu", seeds=(1,))
    assert ok.passed, ok.why

    def swapped(x, w_gate_up, *, out, config=None):  # SiLU on the up half
        n = w_gate_up.shape[0] // 2
        mlp.gate_up_silu(x, torch.cat([w_gate_up[n:], w_gate_up[:n]]).contiguous(), out=out, config=config)

    bad = gates.correctness(dataclasses.replace(cand, implementation=swapped), "cpu", seeds=(1,))
    assert not bad.passed and bad.rule == "kernel_incorrect", bad.why


def test_every_catalog_kernel_is_profiled_under_its_own_category():
    # a profile of a stack with catalog kernels must put their time where it belongs (the
    # H200 campaign's final profile had the attention kernels under "other" before they were named for it)
    import triton as _triton

    from inferloom.kernels.catalog import decode_attention as da_mod
    from inferloom.kernels.catalog import mlp as mlp_mod
    from inferloom.kernels.catalog import rmsnorm as rms_mod
    from inferloom.measure.op_categories import categorize

    want = {"_decode_attn_split_kernel": "attention", "_decode_attn_merge_kernel": "attention",
            "_gemm_gate_up_silu_kernel": "gemm", "_silu_mul_kernel": "elementwise",
            "_add_rmsnorm_kernel": "normalization"}
    kinds = (_triton.runtime.JITFunction,) + ((_triton.runtime.interpreter.InterpretedFunction,)
                                              if hasattr(_triton.runtime, "interpreter") else ())
    found = {name for mod in (da_mod, mlp_mod, rms_mod) for name, obj in vars(mod).items() if isinstance(obj, kinds)}
    assert found == set(want)
    assert {name: categorize(name) for name in want} == want
