"""The KERNEL phase's microbenchmark gate on the catalog's decode-attention
candidate at the Llama-3.1-8B decode shape (batch 64, context 320 of a
384-slot cache), timed two ways in one run: CUDA events around each call as
the gate does (``gates.time_call``: the GPU is held busy while the host
enqueues the call, so launch overhead is not counted), and the same without
that spin (what the gate did before: host launch time included).

    python3 benchmarks/gpu_gate_timing.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args(argv)
    import torch

    from inferloom.kernels import gates
    from inferloom.kernels.base import Target
    from inferloom.kernels.catalog_backend import CatalogBackend

    if not torch.cuda.is_available():
        print("gpu_gate_timing: needs a CUDA device", file=sys.stderr)
        return 2
    work = {"device": "cuda", "dtype": "bfloat16", "model": "llama-3.1-8b", "framework": "transformers",
            "batch": 64, "input_len": 256, "output_len": 128,
            "stack": {"cache_implementation": "static", "attn_implementation": "sdpa"}}
    [cand] = [c for c in CatalogBackend().propose([Target("attention", 0.4, True, "test")], work)]
    rows = {}
    spin = gates.SPIN_CYCLES
    for label, cycles in (("gate (launch hidden)", spin), ("no spin (launch counted)", 0)):
        gates.SPIN_CYCLES = cycles
        r = gates.microbenchmark(cand, "cuda", runs=args.runs)
        d = r.details
        rows[label] = {"kernel_us": d["kernel_median_s"] * 1e6, "baseline_us": d["baseline_median_s"] * 1e6,
                       "speedup": d["speedup"], "passed": r.passed}
        print(f"{label:<26} kernel {d['kernel_median_s'] * 1e6:8.1f} us  baseline {d['baseline_median_s'] * 1e6:8.1f} us"
              f"  x{d['speedup']:.2f}", flush=True)
    gates.SPIN_CYCLES = spin
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "candidate": cand.id,
           "shape": dict(cand.shapes[0]), "runs": args.runs, "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
