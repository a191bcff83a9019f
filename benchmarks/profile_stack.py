"""Profile a session's final stack (or stock) with the same profiler the
session uses, and print its category breakdown next to the roofline.

    python3 benchmarks/profile_stack.py SESSION_DIR [--stock] [--out FILE.json]

Reads the session's spec (manifest.json) and final stack (state.json), builds
the adapter, runs the stack once untimed (compilation, CUDA-graph capture),
then once under torch.profiler (``measure.profile.profile_run``). Shares are
the result; absolute times carry the profiler's overhead and are not a
measurement. Used for the H200 campaign's "profile of the final stack"
(docs/benchmarks.md); works on CPU too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("session", type=Path)
    ap.add_argument("--stock", action="store_true", help="profile the stock configuration instead")
    ap.add_argument("--out", type=Path, help="write the profile JSON here")
    args = ap.parse_args(argv)

    from inferloom.measure.profile import profile_config
    from inferloom.session.manifest import read_manifest
    from inferloom.session.state import load_state
    from inferloom.spec import WorkloadSpec
    from inferloom.workloads.registry import make_adapter

    try:
        manifest = read_manifest(args.session)
        st = load_state(args.session)
    except (OSError, ValueError) as exc:
        print(f"profile_stack: cannot read the session in {args.session}: {exc}", file=sys.stderr)
        return 2
    spec = WorkloadSpec.model_validate(manifest["spec"])
    stack = dict(st.stock_config if args.stock else st.stack)
    changed = {k: v for k, v in stack.items() if st.stock_config.get(k) != v}
    print(f"profiling {'stock' if args.stock else 'the final stack'} of {st.session_id}: "
          f"{changed or 'no changes from stock'} (one untimed warm-up run, then one profiled run)", flush=True)
    adapter = make_adapter(spec)
    t0 = time.perf_counter()
    try:
        prof = profile_config(adapter, stack)
    finally:
        adapter.close()
    prof["stack_changes"] = changed
    prof["session"] = st.session_id
    for cat, row in sorted(prof["categories"].items(), key=lambda kv: -kv[1]["share"]):
        print(f"  {row.get('label', cat):<28} {row['share'] * 100:6.1f}%  {row['seconds'] * 1e3:9.1f} ms")
    print(f"  wall {prof['wall_s']:.3f} s, device busy {prof.get('device_busy_s', 0.0):.3f} s; "
          f"profiled in {time.perf_counter() - t0:.0f} s")
    for op in prof.get("top_ops", [])[:10]:
        print(f"    {op['share'] * 100:5.1f}%  {op.get('category', '?'):<14} {op['name'][:90]}")
    if args.out:
        args.out.write_text(json.dumps(prof, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
