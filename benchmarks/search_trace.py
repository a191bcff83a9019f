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
from search_efficiency import Landscape, knob_space, run_default  # noqa: E402



def trace(ls: Landscape, seed: int, budget: int, **kw: Any) -> list[tuple[str, dict[str, Any], str, float]]:
    """(source, changes, verdict, true log-gain) per trial of run_default with the cross-knob rules."""
    ls.noise = random.Random(seed * 104729 + 17)  # the noise stream search_efficiency gives every strategy
    rows: list[tuple[str, dict[str, Any], str, float]] = []
    run_default(ls, seed, budget, rules=True, on_trial=lambda raw, verdict, v: rows.append(
        (raw["source"], raw["changes"], verdict, v)), **kw)
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
