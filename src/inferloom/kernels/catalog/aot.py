"""Compile the catalog's Triton kernels for a CUDA target on a machine without a GPU.

The interpreter checks a kernel's logic, not whether the compiler accepts it
for the GPU nor what it costs there. This runs each launcher on ``meta``
tensors at a workload's shapes with the kernel replaced by a recorder, then
compiles every recorded launch ahead of time for the target (sm_90 by
default; Triton's wheel carries ``ptxas``), specialising the arguments the
way Triton's JIT does at run time (integers equal to 1 become constants,
pointers and integers divisible by 16 are marked so), and reports the shared
memory each needs against the target's limit.

Run it without ``TRITON_INTERPRET``::

    python -m inferloom.kernels.catalog.aot            # default configs, 8B decode shape
    python -m inferloom.kernels.catalog.aot --all      # every config of every tune space
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from typing import Any, Callable

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from inferloom.kernels.catalog import decode_attention as da
from inferloom.kernels.catalog import mlp, rmsnorm

__all__ = ["record_launches", "compile_launch", "compile_catalog", "SMEM_LIMIT"]

SMEM_LIMIT = {90: 232448}  # bytes of shared memory a block may use (H100/H200, opted in)

_TRITON_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int32: "i32",
                 torch.int64: "i64", torch.float8_e4m3fn: "fp8e4nv"}


class _Recorder:
    def __init__(self, kernel):
        self.kernel = kernel
        self.launches: list[dict[str, Any]] = []

    def __getitem__(self, grid):
        def launch(*args, num_warps=4, num_stages=2, **constexprs):
            self.launches.append({"kernel": self.kernel, "args": args, "constexprs": constexprs, "grid": grid,
                                  "num_warps": num_warps, "num_stages": num_stages})
        return launch


def record_launches(module: Any, names: list[str], call: Callable[[], Any]) -> list[dict[str, Any]]:
    """Run ``call`` with ``module.<name>`` kernels replaced by recorders; the launches they saw."""
    recs = {n: _Recorder(getattr(module, n)) for n in names}
    saved = {n: getattr(module, n) for n in names}
    try:
        for n, r in recs.items():
            setattr(module, n, r)
        call()
    finally:
        for n, k in saved.items():
            setattr(module, n, k)
    return [launch for r in recs.values() for launch in r.launches]


def compile_launch(launch: dict[str, Any], capability: int = 90) -> dict[str, Any]:
    fn = launch["kernel"]
    params = list(inspect.signature(fn.fn).parameters)
    const = dict(launch["constexprs"])
    signature, attrs, it = {}, {}, iter(launch["args"])
    for i, name in enumerate(params):
        if name in const:
            signature[name] = "constexpr"
            continue
        v = next(it)
        if isinstance(v, torch.Tensor):
            signature[name] = "*" + _TRITON_TYPES[v.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]  # torch's allocations are 256-byte aligned
        elif isinstance(v, bool) or v is None:
            signature[name], const[name] = "constexpr", v
        elif isinstance(v, int):
            if v == 1:
                signature[name], const[name] = "constexpr", 1
            else:
                signature[name] = "i32" if -2**31 <= v < 2**31 else "i64"
                if v % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32"
    t0 = time.perf_counter()
    src = ASTSource(fn=fn, signature=signature, constexprs={(params.index(k),): v for k, v in const.items()},
                    attrs=attrs)
    shown = {k: v for k, v in launch["constexprs"].items()}
    row = {"kernel": fn.fn.__name__, "constexprs": shown, "num_warps": launch["num_warps"],
           "num_stages": launch["num_stages"]}
    try:
        k = triton.compile(src, target=GPUTarget("cuda", capability, 32),
                           options={"num_warps": launch["num_warps"], "num_stages": launch["num_stages"]})
        row["shared_bytes"] = int(k.metadata.shared)
        row["fits"] = row["shared_bytes"] <= SMEM_LIMIT.get(capability, 101376)
    except Exception as exc:  # report, don't stop: one bad config must not hide the others
        row["error"] = f"{type(exc).__name__}: {str(exc)[-400:]}"
        row["fits"] = False
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def _meta_calls(all_configs: bool, batch: int = 64, context_len: int = 384) -> list[tuple[str, Any, list[str], Callable]]:
    m = "meta"
    bf = torch.bfloat16
    B, Hq, Hkv, D, S, H, I = batch, 32, 8, 128, context_len, 4096, 14336
    q = torch.empty((B, 1, Hq, D), dtype=bf, device=m).transpose(1, 2)
    kc = torch.empty((B, Hkv, S, D), dtype=bf, device=m)
    lens = torch.empty((B,), dtype=torch.int32, device=m)
    x = torch.empty((B, H), dtype=bf, device=m)
    w = torch.empty((H,), dtype=bf, device=m)
    wgu = torch.empty((2 * I, H), dtype=bf, device=m)
    gu = torch.empty((B, 2 * I), dtype=bf, device=m)

    def cfgs(space, default):
        return list(space) if all_configs else [default]

    calls = []
    for c in cfgs(da.TUNE_SPACE, da.DEFAULT_CONFIG):
        calls.append((f"decode_attention {c}", da, ["_decode_attn_split_kernel", "_decode_attn_merge_kernel"],
                      lambda c=c: da.decode_attention(q, kc, kc, lens, lens, config=c)))
    for c in cfgs(rmsnorm.TUNE_SPACE, rmsnorm.DEFAULT_CONFIG):
        calls.append((f"add_rmsnorm {c}", rmsnorm, ["_add_rmsnorm_kernel"],
                      lambda c=c: rmsnorm.fused_add_rmsnorm(x, x, w, 1e-5, config=c)))
    for c in cfgs(mlp.GATE_UP_TUNE, mlp.GATE_UP_DEFAULT):
        calls.append((f"gate_up_silu {c}", mlp, ["_gemm_gate_up_silu_kernel"],
                      lambda c=c: mlp.gate_up_silu(x, wgu, config=c)))
    for c in cfgs(mlp.SILU_TUNE, mlp.SILU_DEFAULT):
        calls.append((f"silu_mul {c}", mlp, ["_silu_mul_kernel"], lambda c=c: mlp.silu_mul(gu, config=c)))
    return calls


def compile_catalog(all_configs: bool = False, capability: int = 90) -> list[dict[str, Any]]:
    """One row per compiled kernel launch of the catalog at the llama-3.1-8b decode shape."""
    rows = []
    for label, module, names, call in _meta_calls(all_configs):
        for launch in record_launches(module, names, call):
            rows.append({"entry": label, **compile_launch(launch, capability)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="AOT-compile the kernel catalog for a CUDA target (no GPU needed)")
    ap.add_argument("--all", action="store_true", help="every config of every tune space")
    ap.add_argument("--capability", type=int, default=90)
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    rows = compile_catalog(a.all, a.capability)
    for r in rows:
        status = "ok " if r["fits"] else "BAD"
        print(f"{status} {r['kernel']:22s} w{r['num_warps']} s{r['num_stages']} "
              f"smem {r.get('shared_bytes', '-'):>7} {r['seconds']:5.1f}s  {r['entry']}  {r.get('error', '')}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return 0 if all(r["fits"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
