"""The vLLM plugin backend's gates on the Llama-3.1-8B shape (issue 33), as the KERNEL phase runs them in the
inferloom process for a compiling server (batch 64, 256 in: the decode and a prefill shape; bfloat16): each
candidate's correctness, then its microbenchmark timed two ways in one run, interleaved with stock's op:

* ``delivered``: the replacement's ``forward`` as the server calls it, returning its result (``KernelCandidate.timed``,
  what the gate races since 2026-12-06);
* ``through out=``: the gates' implementation, the same forward then a copy into the preallocated ``out`` (what the
  gate raced before: one more kernel on the replacement's side only).

Each at the decode shape (the gate's) and the prefill one. Needs CUDA, torch and triton (no vLLM: stock's op is
vLLM's native composition, compiled by inductor as the server compiles it).

    python3 benchmarks/gpu_plugin_gates.py [--out FILE.json] [--runs 50] [--eager]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--eager", action="store_true", help="the gates of an --enforce-eager server")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the script (the torch replacements only)")
    args = ap.parse_args(argv)
    import torch

    from inferloom.kernels import gates
    from inferloom.kernels.base import Target
    from inferloom.workloads.vllm_kernel_backend import VLLMPluginBackend

    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        print("gpu_plugin_gates: needs a CUDA device", file=sys.stderr)
        return 2
    work = {"device": dev, "dtype": "bfloat16", "model": "llama-3.1-8b", "framework": "vllm", "batch": 64,
            "input_len": 256, "output_len": 128, "stack": {"kernel_plugin": "none"},
            "server_args": ["--enforce-eager"] if args.eager else []}
    cands = VLLMPluginBackend().propose([Target("elementwise", 0.029, True, "h100 profile"),
                                         Target("normalization", 0.023, True, "h100 profile")], work)
    rows = []
    for c in cands:
        row = {"id": c.id, "op": c.op, "correctness": gates.correctness(c, dev).to_dict()}
        for shape in c.shapes:
            at = replace(c, shapes=(shape,))
            for label, cand in (("delivered", at), ("through out=", replace(at, timed=None))):
                r = gates.microbenchmark(cand, dev, runs=args.runs, min_speedup=1.0)
                d = r.details
                row[f"{label} {dict(shape)}"] = {k: d.get(k) for k in ("speedup", "baseline_median_s", "kernel_median_s",
                                                                       "input_sets", "rotation_exceeds_cache")}
                print(f"{c.id:26s} {label:13s} {str(dict(shape)):40s} x{d.get('speedup', float('nan')):.3f} "
                      f"(kernel {d.get('kernel_median_s', 0) * 1e6:7.2f} us, stock {d.get('baseline_median_s', 0) * 1e6:7.2f} us)"
                      if d else f"{c.id} {label}: {r.why}", flush=True)
        rows.append(row)
    out = {"device": torch.cuda.get_device_name(0) if dev == "cuda" else dev, "torch": torch.__version__, "work": work, "runs": args.runs,
           "candidates": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
