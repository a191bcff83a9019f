"""Search efficiency on the real CPU engine (issue 15, part (b)): the searchers
of ``benchmarks/search_efficiency.py`` over a table of real measurements of
the transformers engine on llama-tiny, instead of a synthetic landscape.

A session measuring every searcher over >= 10 seeds on the real engine would
take days on this machine. So the engine is measured once per distinct
configuration of a sub-space of its FRAMEWORK knobs (``measure``: every
feasible configuration, in a seeded random order; one warm-up run, then
``--pairs`` pairs of a stock run and a run of it, adjacent in time, each a
ratio), and the searchers then run over that table (``search``): a
configuration's true value is the mean of its paired log ratios to stock,
and each "measurement" a searcher makes draws one of its pairs at random (the
noise is the engine's own, resampled). Unpaired throughputs were useless on
the shared machine: a first run (3 unpaired runs per configuration) saw
stock at 11-48 tok/s and neighbours of it at 850, as other processes came
and went. The engine's
cross-knob refusals (``check_applicable``) are the infeasible region, as in a
session.

Sub-space (:data:`SUBSPACE`; other knobs at stock): dtype float32/bfloat16,
attn_implementation eager/sdpa, sdpa_backend auto/math, cache dynamic/static,
micro_batch 1-4, prompt_lookup 0-2, decode_loop generate/static_loop.
``compile_mode`` stays off (a compilation costs ~30-60 s per configuration on
this machine) and ``cpu_threads`` at stock (2: the machine's cores).

    nice env PYTHONPATH=src .venv/bin/python benchmarks/search_efficiency_real.py measure --out T.json
    PYTHONPATH=src .venv/bin/python benchmarks/search_efficiency_real.py search --table T.json --seeds 10 --budget 40
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from search_efficiency import STRATEGIES, score  # noqa: E402

from inferloom.spec import load_spec  # noqa: E402
from inferloom.workloads.base import AdapterError, config_key  # noqa: E402
from inferloom.workloads.registry import make_adapter  # noqa: E402
from inferloom.workloads.transformers_knobs import check_applicable  # noqa: E402

SPEC = {"model": "llama-tiny", "device": "cpu", "traffic.concurrency": 4, "traffic.input_len": 16,
        "traffic.output_len": 8, "traffic.num_prompts": 4}
SUBSPACE: dict[str, list[Any]] = {
    "dtype": ["float32", "bfloat16"], "attn_implementation": ["eager", "sdpa"], "sdpa_backend": ["auto", "math"],
    "cache_implementation": ["dynamic", "static"], "micro_batch": [1, 2, 3, 4], "prompt_lookup": [0, 1, 2],
    "decode_loop": ["generate", "static_loop"]}
# ``--subspace compile``: on a machine with cores to spare (the device host), the knobs that can make
# llama-tiny faster than stock on a CPU (compile_mode and cpu_threads; on the first sub-space every
# configuration measured on the device host was slower than stock), with the cross-knob refusals of
# static_loop and prompt_lookup (every prompt_lookup=1 configuration is refused: it needs micro_batch=1).
SUBSPACES: dict[str, dict[str, list[Any]]] = {"default": SUBSPACE, "compile": {
    "compile_mode": ["off", "default"], "cpu_threads": [1, 2, 3, 4], "cache_implementation": ["dynamic", "static"],
    "decode_loop": ["generate", "static_loop"], "micro_batch": [3, 4], "prompt_lookup": [0, 1]}}


def _adapter(spec: dict[str, Any] | None = None) -> Any:
    return make_adapter(load_spec(None, spec or SPEC))


def _setting(text: str) -> tuple[str, Any]:
    """``--set traffic.output_len=32``: a spec key and its value (an int when it reads as one)."""
    key, sep, val = text.partition("=")
    if not sep or key not in SPEC:
        raise SystemExit(f"--set {text!r}: want KEY=VALUE with KEY one of {sorted(SPEC)}")
    return key, int(val) if val.lstrip("-").isdigit() else val


def feasible_configs(knobs: list[Any], subspace: dict[str, list[Any]] = SUBSPACE) -> list[dict[str, Any]]:
    stock = {k.name: k.default for k in knobs}
    out = []
    for vals in itertools.product(*subspace.values()):
        cfg = {**stock, **dict(zip(subspace, vals))}
        try:
            check_applicable(knobs, cfg, "cpu")
            out.append(cfg)
        except AdapterError:
            pass
    return out


def measure(args: argparse.Namespace) -> None:
    """Every feasible configuration, in a seeded random order: prepared, one warm-up run, then ``--pairs``
    pairs of one stock run and one run of it, adjacent in time (order alternating), each pair a ratio:
    on a shared machine whose load swings (other processes come and go) an unpaired throughput is mostly
    the load at the time; a ratio to stock measured next to it is the configuration's effect."""
    spec = {**SPEC, **dict(_setting(s) for s in args.set)}
    ad = _adapter(spec)
    knobs = ad.knob_space()
    subspace = SUBSPACES[args.subspace]
    configs = feasible_configs(knobs, subspace)
    random.Random(0).shuffle(configs)
    k, n = (int(x) for x in args.shard.split("/"))
    if not 0 <= k < n:
        raise SystemExit(f"--shard {args.shard}: want K/N with 0 <= K < N")
    stock_cfg = {kn.name: kn.default for kn in knobs}
    shard = configs[k::n]  # a shard: run N of these side by side, each on its own cores (taskset)
    configs = [stock_cfg] + [c for c in shard if c != stock_cfg]  # stock's A/A first in every shard (pooled)
    commit = os.environ.get("INFERLOOM_GIT_REVISION") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    import torch

    meta = {"command": " ".join(sys.argv), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": commit, "machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores",
            "python": platform.python_version(), "torch": torch.__version__, "spec": spec, "subspace": subspace,
            "pairs": args.pairs, "shard": args.shard, "threads": torch.get_num_threads(),
            "affinity": sorted(os.sched_getaffinity(0)), "stock": stock_cfg, "loadavg_start": os.getloadavg(), "configs": len(configs)}
    stock = ad.prepare({})
    ad.run(stock, 9_999)  # warm-up, untimed

    errors: list[str] = []  # the current configuration's failed runs: why (kept in its row)

    def tps(handle: Any, seed: int) -> float | None:
        r = ad.run(handle, seed)
        if not r.success:
            errors.append((r.error or "failed without a message")[:500])
        return r.output_tokens / r.wall_s if r.success and r.wall_s > 0 else None

    rows: dict[str, Any] = {}
    t0 = time.time()
    for i, cfg in enumerate(configs):
        errors.clear()
        handle = ad.prepare(cfg)
        try:
            ad.run(handle, 10_000 + i)  # warm-up, untimed
            pairs = []
            for p in range(args.pairs):
                seed = 20_000 + 10 * i + p  # the same prompts for both sides of a pair
                if p % 2 == 0:
                    a = tps(stock, seed)
                    b = tps(handle, seed)
                else:  # the configuration first
                    b = tps(handle, seed)
                    a = tps(stock, seed)
                pairs.append([a, b])
        finally:
            ad.release(handle)
        ratios = [b / a for a, b in pairs if a and b]
        rows[config_key(cfg)] = {"config": cfg, "pairs_tok_s": pairs, "ratios": ratios,
                                 "errors": sorted(set(errors))}
        meta.update(wall_s=time.time() - t0, loadavg_end=os.getloadavg(), measured=len(rows))
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))  # a cut run keeps its rows
        print(f"{i + 1}/{len(configs)} {time.time() - t0:6.0f} s  x{statistics.mean(ratios) if ratios else float('nan'):7.3f}  "
              f"(stock {statistics.mean(a for a, _ in pairs if a):7.1f} tok/s)  "
              + ", ".join(f"{k}={cfg[k]}" for k in subspace), flush=True)
    meta.update(wall_s=time.time() - t0, loadavg_end=os.getloadavg())
    ad.release(stock)
    ad.close()
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


def table_stock(table: dict[str, Any], all_knobs: list[Any]) -> dict[str, Any]:
    """The stock configuration the table was measured against: ``meta.stock``; in a sharded table written
    before it was recorded, each shard's first row (measured first by construction); in an older table,
    the knobs' defaults with the measured values of the knobs outside the sub-space (``cpu_threads``
    is the measuring process's thread count, not this one's)."""
    meta, first = table["meta"], next(iter(table["rows"].values()))["config"]
    if meta.get("stock"):
        return dict(meta["stock"])
    if "shard" in meta:
        return dict(first)
    return {**{k.name: k.default for k in all_knobs}, **{n: v for n, v in first.items() if n not in meta["subspace"]}}


class MeasuredLandscape:
    """The duck type the searchers of search_efficiency.py use, over a measured table."""

    def __init__(self, table: dict[str, Any], all_knobs: list[Any], estimator: str = "median") -> None:
        self.center = statistics.median if estimator == "median" else statistics.mean
        self.all_knobs = all_knobs
        self.dom = {n: list(v) for n, v in table["meta"]["subspace"].items()}
        self.stock = table_stock(table, all_knobs)
        self.knobs = [replace(k, choices=tuple(self.dom[k.name])) if k.kind == "choice" and k.name in self.dom
                      else replace(k, low=min(self.dom[k.name]), high=max(self.dom[k.name])) if k.name in self.dom
                      else k for k in all_knobs if k.name in self.dom]  # what the searchers may change
        self.runs = {key: [math.log(x) for x in r["ratios"]] for key, r in table["rows"].items() if r["ratios"]}
        self.base = 0.0  # values are log ratios to stock, each measured next to a stock run
        self.best = max(self.center(v) for v in self.runs.values())
        self.noise = random.Random(0)

    def full(self, cfg: dict[str, Any]) -> dict[str, Any]:
        return {**self.stock, **cfg}

    def feasible(self, cfg: dict[str, Any]) -> bool:
        return config_key(self.full(cfg)) in self.runs

    def refusal(self, cfg: dict[str, Any]) -> str | None:
        """The engine's refusal message for an infeasible ``cfg`` (what a session's trial quotes), else None."""
        if self.feasible(cfg):
            return None
        try:
            check_applicable(self.all_knobs, self.full(cfg), "cpu")
        except AdapterError as exc:
            return str(exc)
        return "no successful run of this configuration in the measured table"

    def value(self, cfg: dict[str, Any]) -> float:
        """The median (or mean) of its paired log ratios to stock (stock's own: its A/A pairs)."""
        return self.center(self.runs[config_key(self.full(cfg))])

    def measure(self, cfg: dict[str, Any]) -> float | None:
        """One of its measured pairs, drawn at random: the engine's own noise."""
        runs = self.runs.get(config_key(self.full(cfg)))
        return self.noise.choice(runs) if runs else None


def load_tables(paths: list[str]) -> dict[str, Any]:
    """One table from the shards of one ``measure`` (``--shard K/N``): their rows together; the meta of
    the first, with the wall time of the slowest shard and every shard's own meta under ``shards``."""
    tables = [json.loads(Path(p).read_text()) for p in paths]
    rows: dict[str, Any] = {}
    for t in tables:
        for key, row in t["rows"].items():
            if key in rows:  # stock in every shard: its A/A pairs, pooled
                rows[key] = {**rows[key], "pairs_tok_s": rows[key]["pairs_tok_s"] + row["pairs_tok_s"],
                             "ratios": rows[key]["ratios"] + row["ratios"]}
            else:
                rows[key] = row
    meta = dict(tables[0]["meta"])
    if len(tables) > 1:
        meta.update(wall_s=max(t["meta"]["wall_s"] for t in tables), configs=sum(t["meta"]["configs"] for t in tables),
                    loadavg_end=max((t["meta"]["loadavg_end"] for t in tables), key=lambda x: x[0]),
                    shards=[t["meta"] for t in tables])
    return {"meta": meta, "rows": rows}


def search(args: argparse.Namespace) -> None:
    table = load_tables(args.table)
    ls = MeasuredLandscape(table, _adapter().knob_space(), args.estimator)
    budgets = [b for b in (5, 10, 20, 40) if b <= args.budget]
    m = table["meta"]
    sd = statistics.mean(statistics.stdev(v) for v in ls.runs.values() if len(v) > 1)
    aa = ls.runs.get(config_key(ls.stock))
    if aa is None:
        raise SystemExit(f"search: the table has no stock row (its A/A pairs): measure it again ({args.table})")
    print(f"table: {len(ls.runs)} configurations measured ({m['date']}, commit {m['commit']}, {m['pairs']} pairs each, "
          f"{m['wall_s'] / 60:.1f} min, load {m['loadavg_start'][0]:.1f} -> {m['loadavg_end'][0]:.1f}); stock A/A "
          f"x{math.exp(ls.center(aa)):.3f}; {args.estimator} of the pairs; best x{math.exp(ls.best):.3f} over stock; mean sd of a pair's "
          f"log ratio {sd:.3f}")
    best_key = max(ls.runs, key=lambda k: ls.center(ls.runs[k]))  # the best configuration
    above = sum(1 for v in ls.runs.values() if ls.center(v) > math.log(1.05))
    print(f"{above} of {len(ls.runs)} configurations over x1.05 of stock")
    print(f"best: {best_key}")
    print("| strategy | " + " | ".join(f"@{b}" for b in budgets) + " | trials to 95% | infeasible tried |")
    print("| --- " * (len(budgets) + 3) + "|")
    results = {}
    for name, fn in STRATEGIES.items():
        rs = []
        for seed in range(args.seeds):
            ls.noise = random.Random(seed * 104729 + 17)  # the same noise draws for every strategy
            rs.append(score(fn(ls, seed, args.budget), ls.best, budgets))
        means = {b: statistics.mean(r[0][b] for r in rs) for b in budgets}
        reach = statistics.mean(r[1] for r in rs)
        never = sum(1 for r in rs if r[1] > args.budget)
        infeasible = statistics.mean(r[2] for r in rs)
        results[name] = {"best_fraction": means, "trials_to_95": reach, "never_reached": never,
                         "infeasible": infeasible}
        print(f"| {name} | " + " | ".join(f"{means[b] * 100:.0f}%" for b in budgets)
              + f" | {reach:.1f} ({never} never) | {infeasible:.1f} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"table_meta": m, "results": results}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    me = sub.add_parser("measure")
    me.add_argument("--out", required=True)
    me.add_argument("--pairs", type=int, default=3)
    me.add_argument("--subspace", choices=sorted(SUBSPACES), default="default",
                    help="the knobs measured (default: the first sub-space; compile: compile_mode and cpu_threads too)")
    me.add_argument("--shard", default="0/1", help="K/N: measure every N-th feasible configuration from the K-th "
                    "(N shards side by side, each pinned to its own cores; `search --table` takes them all)")
    me.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="change the traffic of the measured spec, e.g. traffic.output_len=32 (recorded in the table)")
    se = sub.add_parser("search")
    se.add_argument("--table", required=True, nargs="+", help="a table, or the shards of one")
    se.add_argument("--seeds", type=int, default=10)
    se.add_argument("--budget", type=int, default=40)
    se.add_argument("--json")
    se.add_argument("--estimator", choices=("median", "mean"), default="median",
                    help="a configuration's true value from its pairs (median: a contention spike in one pair "
                    "does not make it the best)")
    args = ap.parse_args()
    (measure if args.cmd == "measure" else search)(args)


if __name__ == "__main__":
    main()
