"""Trace the default orchestrator (with the cross-knob rules) on the synthetic landscapes of
benchmarks/search_efficiency.py: per landscape, the optimum (its values off stock, its pairwise
interactions), the additive-only optimum (main effects alone), and every trial (source, verdict, true value
and running best as fractions of the best known). The diagnosis of docs/benchmarks.md section 10,
"Diagnosis and two tries", was read from it.

    PYTHONPATH=src .venv/bin/python benchmarks/search_trace.py --family random --seeds 0-9 [--kw '{"prior_tries": 1}']
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from search_efficiency import KEEP_RATIO, Landscape, knob_space  # noqa: E402

from inferloom.agents.rules import RuleOrchestrator  # noqa: E402
from inferloom.workloads.base import config_key  # noqa: E402


def trace(ls: Landscape, seed: int, budget: int, **kw: Any) -> list[tuple[str, dict[str, Any], str, float]]:
    """(source, changes, verdict, true log-gain) per trial, measured as run_default does."""
    o = RuleOrchestrator(seed=seed, feasible=ls.feasible, **kw)
    state: dict[str, Any] = {"device": "cpu", "knobs": [k.to_dict() for k in ls.knobs], "pinned": {},
                             "stock_config": ls.stock, "stack": dict(ls.stock), "trials": [],
                             "measured_config_keys": [config_key(ls.stock)], "proposals": [], "kb_failures": [],
                             "workload": {"concurrency": 8, "dtype": "float32"}, "cycle": 1}
    ls.noise = random.Random(seed * 104729 + 17)
    rows = []
    while len(rows) < budget:
        raw = o.propose(state)
        if raw.get("action") != "try_config":
            break
        cfg = {**state["stack"], **raw["changes"]}
        m = ls.measure(cfg)
        ratio = None if m is None else math.exp(m - ls.value(state["stack"]))
        verdict = "failed" if m is None else "keep" if ratio > KEEP_RATIO else "revert"
        state["trials"].append({"changes": raw["changes"], "config": cfg, "verdict": verdict, "ratio": ratio,
                                "cycle": 1, "lesson": ""})
        state["measured_config_keys"].append(config_key(cfg))
        rows.append((raw["source"], raw["changes"], verdict, ls.value(cfg)))
        if verdict == "keep":
            state["stack"] = cfg
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=("prior-aligned", "random"), default="prior-aligned")
    ap.add_argument("--seeds", default="0-9", help="A-B")
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--kw", default="{}", help="RuleOrchestrator keyword arguments, JSON")
    args = ap.parse_args()
    knobs, space, dom = knob_space()
    a, b = (int(x) for x in args.seeds.split("-"))
    for seed in range(a, b + 1):
        ls = Landscape(args.family, seed, knobs, space, dom)
        feas = [c for c in ls.all_configs() if ls.feasible(c)]
        opt = max(feas, key=ls.value)
        add = max(feas, key=lambda c: sum(ls.main[(n, c[n])] for n in ls.dom))
        off = lambda c: {k: v for k, v in c.items() if v != ls.stock[k]}  # noqa: E731
        print(f"=== {args.family} seed {seed}: best x{math.exp(ls.best):.3f} at {off(opt)}")
        print(f"  additive-only optimum {off(add)}: {ls.value(add) / ls.best:.2f} of the best")
        print("  interactions at the optimum: " + ", ".join(
            f"{x}x{y} {ls.pairs.get((x, opt[x], y, opt[y]), 0.0):+.3f}" for x, y in sorted(ls.pair_names)))
        run = 0.0
        for i, (src, ch, verdict, v) in enumerate(trace(ls, seed, args.budget, **json.loads(args.kw)), 1):
            run = max(run, v)
            print(f"  {i:2d} {src:6s} {verdict:6s} {v / ls.best:+.2f} best {run / ls.best:.2f} {ch}")


if __name__ == "__main__":
    main()
