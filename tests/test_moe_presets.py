"""An MoE preset's shape (vLLM's fused-MoE (E, N), no tuned H200 config shipped) and its cost model:
active parameters for FLOPs, the experts a decode step's tokens are routed to for the bytes read."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

from inferloom.measure import costs as C
from inferloom.models.moe_presets import MOE_PRESETS
from inferloom.workloads import vllm_moe_configs as MC

OLMOE = MOE_PRESETS["olmoe-1b-7b"]


def _vllm_package() -> str | None:
    py = os.environ.get("INFERLOOM_VLLM_PYTHON")
    if not py:
        return None
    found = glob.glob(os.path.join(os.path.dirname(os.path.dirname(py)), "lib", "python3*", "site-packages", "vllm"))
    return found[0] if found else None


def test_the_olmoe_fused_moe_shape_has_no_shipped_h200_config():
    assert MC.moe_shape(OLMOE) == (64, 1024)
    name = MC.config_file_name(64, 1024, "NVIDIA H200")
    assert name == "E=64,N=1024,device_name=NVIDIA_H200.json"
    pkg = _vllm_package()
    if pkg is None:
        pytest.skip("no vLLM environment (INFERLOOM_VLLM_PYTHON) to read the shipped configs folder from")
    assert MC.shipped_config(pkg, name) is None  # vLLM uses its default Triton config for this shape
    assert MC.shipped_config(pkg, MC.config_file_name(8, 14336, "NVIDIA H200")) is not None  # Mixtral's is there


def test_the_cost_model_counts_active_parameters_of_an_moe_model():
    h, nl, E, k, im, v = 2048, 16, 64, 8, 1024, 50304
    attn, expert, router = 4 * h * h, 3 * h * im, h * E
    m = C.step_costs(OLMOE, batch=1, context_len=100, dtype_bytes="bfloat16", input_len=64)["model"]
    assert m["parameters"] == nl * (attn + E * expert + router + 2 * h) + h + 2 * v * h
    assert m["active_parameters"] == nl * (attn + k * expert + router + 2 * h) + h + 2 * v * h
    assert 6.8e9 < m["parameters"] < 7.0e9 and 1.2e9 < m["active_parameters"] < 1.35e9  # model card: 6.9B / 1.3B
    assert m["matmul_params"] == nl * (attn + k * expert + router) + v * h


def test_a_decode_step_reads_only_the_experts_its_tokens_are_routed_to():
    B = 2.0
    one = C.step_costs(OLMOE, batch=1, context_len=100, dtype_bytes=B)
    der, shape = one["model"], C.model_shape(OLMOE)
    assert C.experts_touched(shape, 1) == pytest.approx(8.0)
    assert C.experts_touched(shape, 64) == pytest.approx(64 * (1 - (56 / 64) ** 64))
    unread = 16 * (64 - 8) * 3 * 2048 * 1024 * B  # b = 1: 56 experts per layer not read
    assert one["decode_step"]["bytes_breakdown"]["weights"] == pytest.approx(der["weights_read_bytes"] - unread + B * 2048)
    many = C.step_costs(OLMOE, batch=256, context_len=100, dtype_bytes=B)["decode_step"]["bytes_breakdown"]["weights"]
    assert many == pytest.approx(der["weights_read_bytes"] + B * 256 * 2048, rel=1e-6)  # every expert read
    flops = one["decode_step"]["flops_breakdown"]["matmul"]
    assert flops == 2.0 * der["matmul_params"]  # FLOPs of the active parameters only


def test_a_dense_model_costs_what_it_did():
    m = C.step_costs("llama-3.1-8b", batch=4, context_len=512, dtype_bytes=2.0)
    assert m["model"]["num_experts"] is None and m["model"]["active_parameters"] == m["model"]["parameters"]
    assert m["decode_step"]["bytes_breakdown"]["weights"] == m["model"]["weights_read_bytes"] + 2.0 * 4 * 4096


def test_the_preset_is_a_config_only_model_directory_a_session_can_name(tmp_path, monkeypatch):
    from transformers import AutoConfig, AutoTokenizer

    from inferloom.models.moe_preset_dir import MARKER
    from inferloom.spec import load_spec

    monkeypatch.setenv("INFERLOOM_CACHE", str(tmp_path))
    spec = load_spec(None, {"framework": "vllm", "model": "olmoe-1b-7b", "device": "cpu"})
    d = spec.model
    assert d.endswith("olmoe-1b-7b-config-only") and (tmp_path / "server-models" / "olmoe-1b-7b-config-only").is_dir()
    cfg = AutoConfig.from_pretrained(d)
    assert (type(cfg).__name__, cfg.architectures, cfg.num_experts, cfg.num_experts_per_tok) == \
        ("OlmoeConfig", ["OlmoeForCausalLM"], 64, 8)
    assert MC.moe_shape(cfg.to_dict()) == (64, 1024) and cfg.hidden_size == OLMOE["hidden_size"]
    tok = AutoTokenizer.from_pretrained(d)
    assert len(tok) <= cfg.vocab_size and tok("a b c")["input_ids"]
    files = {p.name for p in Path(d).iterdir()}
    assert MARKER in files and not any(f.endswith((".safetensors", ".bin")) for f in files)  # no 14 GB written
    again = load_spec(None, {"framework": "vllm", "model": "olmoe-1b-7b", "device": "cpu"})
    assert again.model == d
    # a session's manifest holds the directory of the machine that ran it (the H100's was under
    # /tmp/inferloom-cache): here it is written again from the preset, so the session resumes and reports
    there = load_spec(None, {"framework": "vllm", "model": "/tmp/elsewhere/server-models/olmoe-1b-7b-config-only",
                             "device": "cpu"})
    assert there.model == d
    with pytest.raises(Exception, match="expected a preset"):  # not a preset's name: no directory to write
        load_spec(None, {"framework": "vllm", "model": "/tmp/elsewhere/server-models/mixtral-x-config-only",
                         "device": "cpu"})
