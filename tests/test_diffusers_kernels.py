"""KERNEL-phase targets for image workloads (issue 16): a denoiser with eager q/k RMSNorms (SD3.5's
``qk_norm: rms_norm``; preset sd35-tiny) gets the kernel backend's RMSNorm candidate when the profile's
normalization share picks it: the torch backend's on a CPU (through the real gates here), the catalog's Triton
kernel on CUDA; a denoiser without the op gets none, and the engine refuses the knob where it cannot apply."""

import pytest
import torch

from inferloom.kernels.base import workload_of
from inferloom.kernels.gates import correctness, microbenchmark
from inferloom.kernels.registry import resolve_backend
from inferloom.kernels.select import select_targets
from inferloom.measure import quality as Q
from inferloom.spec import load_spec
from inferloom.workloads.base import resolve_config

TINY = {"framework": "diffusers", "device": "cpu", "diffusion.height": "32", "diffusion.width": "32",
        "diffusion.steps": "2", "quality.eval_prompts": "2", "quality.heldout_prompts": "2"}
HOT_NORM = {"normalization": {"share": 0.2}, "gemm": {"share": 0.3}, "idle": {"share": 0.5}}


def _spec(model, **kw):
    return load_spec(None, {**TINY, "model": model, **kw})


def _stock_stack(spec):
    from inferloom.workloads.diffusers_knobs import diffusers_knobs

    return resolve_config(diffusers_knobs(spec.dtype, "sd3", 1), {})


def test_the_workload_tells_a_backend_the_denoisers_rmsnorm_rows():
    spec = _spec("sd35-tiny")
    d = workload_of(spec, "cpu", _stock_stack(spec))["diffusion"]
    # 32x32 over the VAE's factor 2, patch 1: 256 latent tokens + 77 CLIP + 16 T5 positions; CFG doubles the batch
    assert d == {"family": "sd3", "batch": 2, "tokens": 256 + 77 + 16, "heads": 4, "head_dim": 8,
                 "rmsnorms": 8, "rms_rows": 2 * 4 * (256 + 77 + 16)}  # q, k, added q, added k x 2 blocks
    assert workload_of(_spec("sd3-tiny"), "cpu", _stock_stack(spec))["diffusion"]["rmsnorms"] == 0


def test_the_torch_backend_proposes_a_fused_rmsnorm_that_passes_the_gates_on_cpu():
    spec = _spec("sd35-tiny")
    work = workload_of(spec, "cpu", _stock_stack(spec))
    backend, why = resolve_backend("auto", work)
    assert backend is not None and backend.name == "torch", why
    targets = select_targets(HOT_NORM, backend.rewritable(), 0.05)
    cands = backend.propose(targets, work)
    assert [c.id for c in cands] == ["rmsnorm-torch-fused"]
    c = cands[0]
    assert c.config_changes == {"rmsnorm_impl": "torch_fused"} and c.shapes[0]["seq"] == 2 * 4 * 349
    assert c.shapes[0]["hidden"] == 8 and c.target == "normalization"
    ok = correctness(c, "cpu")
    assert ok.passed, ok
    mb = microbenchmark(c, "cpu", runs=5, warmup=1)  # the timing gate runs at the workload's rows (its verdict is
    assert mb.gate and (mb.passed or mb.rule), mb  # the machine's: a pass, or a refusal that names its rule)
    # nothing to replace: no candidate, whatever the profile says
    plain = workload_of(_spec("sd3-tiny"), "cpu", _stock_stack(spec))
    assert backend.propose(targets, plain) == []
    none, why = resolve_backend("auto", plain)  # so the phase is skipped, saying why, and FRAMEWORK reserves nothing
    assert none is None and "backend torch: the denoiser has no eager RMSNorm" in why
    done = workload_of(spec, "cpu", {**_stock_stack(spec), "rmsnorm_impl": "torch_fused"})
    assert backend.propose(targets, done) == []  # already in the stack


def test_the_catalog_backend_proposes_its_triton_rmsnorm_on_cuda():
    pytest.importorskip("triton")
    spec = _spec("sd35-tiny", dtype="bfloat16")
    work = workload_of(spec, "cuda", {**_stock_stack(spec), "dtype": "bfloat16"})
    backend, why = resolve_backend("auto", work)
    assert backend is not None and backend.name == "catalog", why
    cands = backend.propose(select_targets(HOT_NORM, backend.rewritable(), 0.05), work)
    assert [c.id for c in cands] == ["catalog-rmsnorm"]
    c = cands[0]
    assert c.config_changes == {"rmsnorm_impl": "triton"} and c.dtype == "bfloat16"
    assert c.shapes[0] == {"tokens": 2 * 4 * 349, "hidden": 8, "no_residual": 1}
    # the catalog entry's own reference and baseline at that shape: a plain RMSNorm (no residual)
    inputs, _ = c.make_inputs(c.shapes[1], "float32", "cpu", 0)
    assert inputs["residual"] is None
    y, _ = c.baseline(**inputs)
    ref, _ = c.reference(**inputs)
    assert torch.allclose(y.double(), ref, rtol=1e-4, atol=1e-5)
    flux = workload_of(_spec("flux-tiny", dtype="bfloat16"), "cuda", work["stack"])
    assert backend.propose(select_targets(HOT_NORM, backend.rewritable(), 0.05), flux) == []
    assert "catalog: the denoiser has no eager RMSNorm" in resolve_backend("auto", flux)[1]


def test_the_engine_applies_the_switch_and_refuses_it_where_it_cannot():
    from inferloom.workloads.diffusers_engine import DiffusersEngine

    plain = DiffusersEngine(_spec("sd3-tiny"))
    try:
        assert "no eager RMSNorm" in plain.config_refusal({"rmsnorm_impl": "torch_fused"})
    finally:
        plain.close()
    e = DiffusersEngine(_spec("sd35-tiny"))
    try:
        assert "CUDA kernel" in e.config_refusal({"rmsnorm_impl": "triton"})
        th = Q.QualityThresholds.from_spec(e.spec.quality)
        items = Q.quality_prompt_sets(e.spec, e)["eval"]
        stock = e.prepare({})
        ref = Q.capture_reference(e, stock, "eval", items, 0)
        e.release(stock)
        h = e.prepare({"rmsnorm_impl": "torch_fused"})
        try:
            assert h.notes["rmsnorm_impl"] == "torch_fused: 8 RMSNorm modules of the denoiser"
            v = Q.evaluate(e, h, ref, th)
            assert v.passed, v.message  # same numerics up to rounding
        finally:
            e.release(h)
    finally:
        e.close()


@pytest.mark.slow
def test_a_session_on_a_qk_norm_pipeline_proposes_the_rmsnorm_kernel_and_gates_it(tmp_path):
    import subprocess
    import sys

    from inferloom.session import ledger as L

    d = tmp_path / "session"
    spec = tmp_path / "spec.yaml"
    spec.write_text("framework: diffusers\nmodel: sd35-tiny\ndevice: cpu\n"
                    "diffusion: {height: 32, width: 32, steps: 2}\nquality: {eval_prompts: 2, heldout_prompts: 2}\n"
                    "protocol: {min_pairs: 3, max_pairs: 4}\npinned: {compile_mode: 'off', cpu_threads: 1}\n"
                    "kernels: {min_share: 0.005}\n")
    p = subprocess.run([sys.executable, "-m", "inferloom.cli", "optimize", str(spec), "--budget-minutes", "4",
                        "--max-trials", "2", "--no-kb", "--out", str(d)], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    entries = L.read_entries(d)
    targets = [e for e in entries if e["kind"] == "kernel_targets"]
    assert targets and targets[0]["backend"] == "torch"
    assert any(t["category"] == "normalization" and t["picked"] for t in targets[0]["targets"]), targets[0]
    claims = [e["candidate"] for e in entries if e["kind"] == "kernel_claim"]
    assert [c["id"] for c in claims] == ["rmsnorm-torch-fused"]
    assert claims[0]["config_changes"] == {"rmsnorm_impl": "torch_fused"} and claims[0]["claim_status"] == "unverified"
    gates = {e["gate"]: e for e in entries if e["kind"] == "kernel_gate"}
    assert gates["correctness"]["passed"], gates["correctness"]
    # the microbenchmark decides on this machine: a refusal names its rule, a pass leads to a measured trial
    mb = gates["microbenchmark"]
    tried = [e for e in entries if e["kind"] == L.VERDICT and (e.get("changes") or {}).get("rmsnorm_impl")]
    assert (not mb["passed"] and mb["rule"] == "kernel_not_faster" and not tried) or (mb["passed"] and tried), (mb, tried)
