"""How a paired A/B comparison of two vLLM CPU servers behaves on one small
machine: does the idle server of a pair burn CPU while the other is measured?

Starts two identical stock servers (``--enforce-eager``) of a tiny random
Llama, then measures, and writes one JSON (raw numbers, no summary invented):

1. start-up seconds of each server (to ``/health`` 200);
2. CPU seconds a fresh, never-loaded server burns in 10 s idle;
3. CPU seconds server A burns in the 1 s right after it served a run (its
   OpenMP threads spin before they sleep);
4. ``pairs`` alternating A/B runs through the adapter (which waits for the
   other server to go quiet before each timed run): per run the output tok/s,
   the quiet wait, and the CPU seconds the *other* server burnt during the run.

Usage: .venv/bin/python benchmarks/vllm_ab_idle.py --vllm-python .venv-vllm/bin/python --out FILE
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--out", default="runs/vllm_ab_idle.json")
    args = ap.parse_args()

    from inferloom.spec import load_spec
    from inferloom.workloads.server_process import group_cpu_seconds
    from inferloom.workloads.vllm_adapter import VLLMAdapter

    spec = load_spec(None, {"framework": "vllm", "device": "cpu", "model": "llama-tiny", "dtype": "bfloat16",
                            "serving.python": args.vllm_python, "traffic.concurrency": 4, "traffic.input_len": 32,
                            "traffic.output_len": 16})
    logs = Path(tempfile.mkdtemp(prefix="vllm-ab-idle-"))
    a = VLLMAdapter(spec, logs, progress=lambda m: print(m, flush=True))
    out: dict = {"machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                             "loadavg_at_start": os.getloadavg()},
                 "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                          text=True).stdout.strip(),
                 "server": a.describe().get("server_distribution"), "spec": spec.to_dict()}
    try:
        ha = a.prepare({"enforce_eager": True})
        hb = a.prepare({"enforce_eager": True})
        out["startup_s"] = [ha.startup_s, hb.startup_s]
        c0 = group_cpu_seconds(hb.server.pgid)
        time.sleep(10)
        out["fresh_idle_cpu_s_per_10s"] = group_cpu_seconds(hb.server.pgid) - c0
        a.run(ha, 1)
        c0 = group_cpu_seconds(ha.server.pgid)
        time.sleep(1.0)
        out["after_serving_cpu_s_in_next_1s"] = group_cpu_seconds(ha.server.pgid) - c0
        runs = []
        for i in range(2 * args.pairs):
            h = ha if i % 2 == 0 else hb
            r = a.run(h, 100 + i)
            runs.append({"server": "A" if h is ha else "B", "success": r.success, "error": r.error,
                         "output_tok_s": (r.extra.get("serving") or {}).get("output_throughput"),
                         "quiet_wait": r.extra.get("quiet_wait"),
                         "other_server_cpu_s_during_run": r.extra.get("idle_servers_cpu_s"), "wall_s": r.wall_s})
            print(runs[-1], flush=True)
        out["runs"] = runs
        out["loadavg_at_end"] = os.getloadavg()
    finally:
        a.close()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
