"""Compile the scripted written kernels (benchmarks/gpu_llm_kernel_session.py's answers, and the tests' verbatim
ones) ahead of time for sm_90 on a machine without a GPU (inferloom.kernels.catalog.aot), at the 8B decode shapes
the author is shown and a few unseen ones: what the Triton interpreter cannot check (dtype rules of tl.exp, shared
memory). Run without TRITON_INTERPRET: PYTHONPATH=src python benchmarks/llm_kernels_aot.py [OUT.json]
(docs/results/llm-kernel-h200-2026-12-01/aot-sm90-cpu.json)."""
import importlib.util
import json
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from gpu_llm_kernel_session import kernels  # noqa: E402

from inferloom.kernels.catalog.aot import compile_launch, record_launches  # noqa: E402
from inferloom.kernels.catalog.index import get  # noqa: E402
from inferloom.kernels.guards import unseen_shapes  # noqa: E402

SHOWN = {"decode_attention": [{"batch": 64, "q_heads": 32, "kv_heads": 8, "head_dim": 128, "max_len": 320, "context": 288}],
         "add_rmsnorm": [{"tokens": 64, "hidden": 4096}, {"tokens": 256, "hidden": 4096}],
         "silu_mul": [{"tokens": 64, "intermediate": 14336}]}
M, BF = "meta", torch.bfloat16


def call(entry, fn, s):
    if entry == "decode_attention":
        q = torch.empty(s["batch"], s["q_heads"], 1, s["head_dim"], device=M, dtype=BF)
        kv = torch.empty(s["batch"], s["kv_heads"], s["max_len"], s["head_dim"], device=M, dtype=BF)
        i = torch.empty(s["batch"], device=M, dtype=torch.int32)
        return lambda: fn(q, kv, kv, i, i, None, out=torch.empty_like(q))
    if entry == "add_rmsnorm":
        x = torch.empty(s["tokens"], s["hidden"], device=M, dtype=BF)
        w = torch.empty(s["hidden"], device=M, dtype=BF)
        return lambda: fn(x, None, w, 1e-5, out=(torch.empty_like(x), torch.empty_like(x)))
    gu = torch.empty(s["tokens"], 2 * s["intermediate"], device=M, dtype=BF)
    return lambda: fn(gu, out=torch.empty(s["tokens"], s["intermediate"], device=M, dtype=BF))


def main():
    ks = kernels()
    extra = Path(__file__).parent / "llm_kernels"
    todo = [("decode_attention", "tests TRITON_DECODE", ks["decode_attention"]),
            ("decode_attention", "blocked (scripted on the GPU)", (extra / "decode_attention_blocked.py").read_text()),
            ("add_rmsnorm", "tests TRITON_RMSNORM", ks["add_rmsnorm"]),
            ("silu_mul", "tests TRITON_SILU_MUL + fp32 upcast", ks["silu_mul"]),
            ("silu_mul", "tests TRITON_SILU_MUL verbatim", ks["silu_mul_verbatim"])]
    out = []
    tmp = Path("/tmp/llm_kernels_aot")
    tmp.mkdir(exist_ok=True)
    for n, (entry, label, src) in enumerate(todo):
        p = tmp / f"k{n}.py"
        p.write_text(src)
        spec = importlib.util.spec_from_file_location(f"aotk{n}", p)  # its module: the launches are recorded there
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        fn = mod.kernel
        names = [k for k, v in vars(mod).items() if type(v).__name__ == "JITFunction"]
        shapes = SHOWN[entry] + unseen_shapes(SHOWN[entry], random.Random(0), get(entry).shape_fit)[:1]
        for s in shapes:
            for launch in record_launches(mod, names, call(entry, fn, s)):
                row = {"entry": entry, "kernel_source": label, "shape": s, **compile_launch(launch)}
                print(json.dumps(row)[:600], flush=True)
                out.append(row)
    Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/llm_kernels_aot.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
