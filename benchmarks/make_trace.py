"""Write a Mooncake-shaped request trace with bursty arrivals (issue 31, item 2): a modulated Poisson process.

The arrival rate is ``rate`` req/s modulated by a slow wave (period ``--period`` s, depth ``--depth``) with
short bursts on top (every ``--burst-every`` s on average, ``--burst-gain`` x the rate for
``--burst-len`` s), drawn by thinning from one seeded ``numpy.random.default_rng``; input and output
lengths uniform in their ranges. One JSON object per line:
``{"timestamp": <ms>, "input_length": N, "output_length": M}`` (the Mooncake shape; docs/loadgen.md).

examples/smollm2-h200-trace.jsonl (2,000 requests over 30.6 s: 65.3 req/s with the bursts, from a base
rate of 58; input 64-512, output 32-256, means 290 and 143 tokens: ~9,340 output tok/s offered, 78% of the
~12,000 tok/s stock SmolLM2 measured on the H200 at c64; 130 KB) was written by:

    python benchmarks/make_trace.py examples/smollm2-h200-trace.jsonl --requests 2000 --rate 58 --seed 31

Deterministic for one numpy version (built with numpy 1.26/2.x: default_rng is stable across them).
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np


def arrivals(n: int, rate: float, rng: np.random.Generator, period: float, depth: float, burst_every: float,
             burst_gain: float, burst_len: float) -> list[float]:
    """``n`` arrival times (s) of the modulated process, by thinning a homogeneous one at its peak rate."""
    # burst starts: a Poisson process of its own, enough of them for the trace's span (~n / rate)
    span = 2.0 * n / rate + 10.0
    starts = np.cumsum(rng.exponential(burst_every, size=int(span / burst_every) + 10))
    peak = rate * (1.0 + depth) * burst_gain
    out: list[float] = []
    t = 0.0
    while len(out) < n:
        t += rng.exponential(1.0 / peak)
        k = np.searchsorted(starts, t, side="right") - 1
        in_burst = k >= 0 and t - starts[k] < burst_len
        lam = rate * (1.0 + depth * math.sin(2.0 * math.pi * t / period)) * (burst_gain if in_burst else 1.0)
        if rng.random() < lam / peak:
            out.append(t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rate", type=float, default=58.0, help="mean req/s before bursts")
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--input", type=int, nargs=2, default=(64, 512), metavar=("MIN", "MAX"))
    ap.add_argument("--output", type=int, nargs=2, default=(32, 256), metavar=("MIN", "MAX"))
    ap.add_argument("--period", type=float, default=4.0)
    ap.add_argument("--depth", type=float, default=0.5)
    ap.add_argument("--burst-every", type=float, default=3.0)
    ap.add_argument("--burst-gain", type=float, default=2.5)
    ap.add_argument("--burst-len", type=float, default=0.3)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    ts = arrivals(a.requests, a.rate, rng, a.period, a.depth, a.burst_every, a.burst_gain, a.burst_len)
    ins = rng.integers(a.input[0], a.input[1] + 1, size=a.requests)
    outs = rng.integers(a.output[0], a.output[1] + 1, size=a.requests)
    with open(a.out, "w") as fh:
        for t, i, o in zip(ts, ins, outs):
            fh.write(json.dumps({"timestamp": round(t * 1000.0, 1), "input_length": int(i),
                                 "output_length": int(o)}) + "\n")
    print(f"{a.out}: {a.requests} requests over {ts[-1]:.1f} s ({a.requests / ts[-1]:.1f} req/s), "
          f"mean input {ins.mean():.0f}, mean output {outs.mean():.0f} tokens")


if __name__ == "__main__":
    main()
