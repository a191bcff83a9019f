"""Calibrate the measurement protocol on synthetic sources with a known truth.

For each true ratio, run the full protocol (sequential looks, bootstrap, t
guard) many times on two sources whose throughput differs by exactly that
ratio, with lognormal per-run noise, and count the verdicts. This is how the
false-keep rate and the power quoted in docs/protocol.md were measured.

    .venv/bin/python benchmarks/protocol_calibration.py --trials 1000 --noise 0.05
"""

from __future__ import annotations

import argparse
import math
import time
from collections import Counter

import numpy as np

from inferloom.measure.protocol import ProtocolSettings, run_paired
from inferloom.workloads.base import RunRecord


def _arm(mult: float, noise: float, rng: np.random.Generator):
    def run(seed: int) -> RunRecord:
        tps = 1000.0 * mult * math.exp(noise * rng.standard_normal())
        return RunRecord(config_id=str(mult), seed=seed, success=True, wall_s=100.0 / tps,
                         output_tokens=100, expected_output_tokens=100, num_requests=1)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--noise", type=float, default=0.05, help="lognormal sd per run")
    ap.add_argument("--resamples", type=int, default=1999)
    ap.add_argument("--ratios", default="0.90,1.00,1.01,1.03,1.05,1.10,1.20")
    ap.add_argument("--no-t-guard", action="store_true")
    args = ap.parse_args()
    settings = ProtocolSettings(bootstrap_resamples=args.resamples, t_guard=not args.no_t_guard)
    print(f"settings: {settings.to_dict()}")
    print(f"noise sd per run {args.noise}, {args.trials} trials per ratio\n")
    print("| true ratio | keep | revert | inconclusive | mean pairs |")
    print("| --- | --- | --- | --- | --- |")
    for r in (float(x) for x in args.ratios.split(",")):
        counts: Counter[str] = Counter()
        pairs = 0
        t0 = time.perf_counter()
        for trial in range(args.trials):
            rng = np.random.default_rng(1_000_000 + trial)
            res = run_paired(_arm(1.0, args.noise, rng), _arm(r, args.noise, rng), settings, seed_base=trial * 100)
            counts[res.verdict] += 1
            pairs += len(res.pairs)
        n = args.trials
        print(f"| {r:.2f} | {counts['keep'] / n:.1%} | {counts['revert'] / n:.1%} | "
              f"{counts['inconclusive'] / n:.1%} | {pairs / n:.1f} |  ({time.perf_counter() - t0:.0f}s)")


if __name__ == "__main__":
    main()
