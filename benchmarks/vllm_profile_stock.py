"""Issue 13: a kernel-level profile of stock vLLM through the server's own
profiler (``/start_profile`` .. ``/stop_profile``), with the roofline of the
model's shape, for docs/benchmarks.md. Issue 32: an SGLang spec (``framework:
sglang``) is profiled the same way through SGLang's own ``/start_profile``
(measure/server_profile.py says how each server is armed).

    python benchmarks/vllm_profile_stock.py examples/llama-3.1-8b-h200-vllm.yaml --out prof.json [--quantization fp8] \
        [--num-prompts 64] [--set KNOB=VALUE ...]

Prints the category shares (device kernels on a GPU; idle = no kernel running
between the first and last kernel) and the top kernels; writes the whole
result as JSON. The profiled run's throughput includes profiler overhead:
take throughput from a session, not from here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from inferloom.measure.server_profile import profile_server
from inferloom.spec import load_spec
from inferloom.workloads.sglang_adapter import SGLangAdapter
from inferloom.workloads.vllm_adapter import VLLMAdapter

ADAPTERS = {"vllm": VLLMAdapter, "sglang": SGLangAdapter}  # the servers with a profiler (server_profiler)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec")
    ap.add_argument("--out", required=True, help="JSON result")
    ap.add_argument("--traces", default="/tmp/vllm-traces", help="where the server writes its traces")
    ap.add_argument("--quantization", default=None, help="profile a configuration with this knob (e.g. fp8)")
    ap.add_argument("--num-prompts", type=int, default=None,
                    help="requests in the profiled run (default the spec's; one wave, = concurrency, keeps the "
                         "trace small: at c64 x 128 tokens a 192-prompt run is three waves of the same steps)")
    ap.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                    help="a knob of the profiled configuration (e.g. attention_backend=triton for SGLang's lean bundle)")
    a = ap.parse_args(argv)
    bad = [x for x in a.set if "=" not in x]
    if bad:
        ap.error(f"--set {bad[0]}: expected KNOB=VALUE")
    spec = load_spec(a.spec, {"traffic.num_prompts": a.num_prompts} if a.num_prompts else None)
    adapter = ADAPTERS.get(spec.framework)
    if adapter is None:
        ap.error(f"{a.spec}: framework {spec.framework} has no server profiler (expected {' or '.join(ADAPTERS)})")
    cfg = dict(x.split("=", 1) for x in a.set)
    if a.quantization:
        cfg["quantization"] = a.quantization
    res = profile_server(spec, cfg, a.traces, make_adapter=adapter, log_dir=Path(a.traces) / "logs")
    Path(a.out).write_text(json.dumps(res, indent=1, default=str))
    print(f"profile ({res['how']}, {res['source']}): wall {res['wall_s']:.3f} s, busy {res['busy_s']:.3f} s")
    for cat, v in res["categories"].items():
        print(f"  {cat:14s} {v['share'] * 100:5.1f}%")
    for t in res["top_ops"]:
        print(f"  {t['share'] * 100:5.1f}%  {t['count']:6d}x  {t['name'][:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
