"""Smoke check of the decode-attention hook inside the real engine: greedy
continuations of a ragged (left-padded) batch through transformers' static
cache with and without ``attention_kernel`` must agree, also under CUDA graphs
(compile reduce-overhead), and one timed run each is printed (a smoke check,
not a measurement: sessions measure).

    python benchmarks/gpu_attention_hook.py [--model llama-tiny] [--kernel triton_decode] [--out FILE]

On a CPU use ``--kernel torch_sliced`` (CUDA graphs are skipped there).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from inferloom.spec import load_spec
from inferloom.workloads.transformers_engine import TransformersEngine


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-tiny")
    ap.add_argument("--kernel", default="triton_decode")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out")
    a = ap.parse_args()
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    spec = load_spec(None, {"model": a.model, "device": dev, "dtype": a.dtype, "traffic.concurrency": 16,
                            "traffic.input_len": 64, "traffic.output_len": 32, "traffic.num_prompts": 16})
    eng = TransformersEngine(spec)
    prompts = [[(7 * i + j) % 1000 + 3 for j in range(5 + 3 * i)] for i in range(8)]  # ragged: 5..26 tokens
    modes = ["off"] + (["reduce-overhead"] if dev == "cuda" else [])
    rows = []
    for mode in modes:
        outs = {}
        for kern in ("sdpa", a.kernel):
            cfg = {"cache_implementation": "static", "compile_mode": mode, "attention_kernel": kern}
            t0 = time.perf_counter()
            h = eng.prepare(cfg)
            try:
                outs[kern] = eng.greedy(h, prompts, 16)
                eng.run(h, 0)  # warm-up (compilation, graph capture)
                rec = eng.run(h, 1)
            finally:
                eng.release(h)
            rows.append({"compile_mode": mode, "attention_kernel": kern, "ok": rec.success, "error": rec.error,
                         "tok_per_s_one_run": rec.output_tokens / rec.wall_s if rec.success else None,
                         "seconds_total": time.perf_counter() - t0})
            print(json.dumps(rows[-1]), flush=True)
        same = sum(x == y for a_, b_ in zip(outs["sdpa"], outs[a.kernel]) for x, y in zip(a_, b_))
        total = sum(len(x) for x in outs["sdpa"])
        rows.append({"compile_mode": mode, "greedy_agreement": same / total, "tokens": total})
        print(json.dumps(rows[-1]), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": dev, "model": a.model, "dtype": a.dtype, "kernel": a.kernel, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
