"""Lookup latency and write rate of the recipe knowledge base, on SQLite and on PostgreSQL (issues 4, 17).

Seeds a fresh KB with N recipes (bulk insert straight into the recipes table,
spread over many models, devices and versions so every tier has competitors),
then times `RecipeStore.lookup` for keys that hit exactly, hit only after
relaxing, and miss everywhere (median and p95 of each); then the write rate of
`RecipeStore.record_session` (the real CLOSE write: one strict read-modify-write
transaction per session) by 1 and by W concurrent writer processes, each
filing sessions under keys of its own (new recipes: inserts) and under one
shared key (the same recipe row: the row lock serializes them).

    .venv/bin/python benchmarks/kb_lookup.py --recipes 100000 --lookups 200          # SQLite only (issue 4)
    .venv/bin/python benchmarks/kb_lookup.py --recipes 1000000 --backend sqlite --backend pg-throwaway \\
        --writes 400 --writers 4                                                     # issue 17
    .venv/bin/python benchmarks/kb_lookup.py --url postgresql+psycopg://USER@HOST/DB --recipes 1000000

``pg-throwaway`` starts a temporary PostgreSQL cluster from Debian's binaries
(tests/pg_cluster.py: initdb in a temp dir, as an unprivileged user when run
as root, fsync on) and removes it after; ``--url`` uses a server you name
(its recipes table must be empty: the seed would collide otherwise).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from inferloom.kb import RecipeStore, WorkloadKey
from inferloom.kb.db import recipes

BREAKDOWN = {"schema_version": 1, "stock_config": {"compile_mode": "off"}, "final_config": {"compile_mode": "default"},
             "stop_reason": "converged",
             "action_path": [{"trial": 1, "cycle": 1, "changes": {"compile_mode": "default"}, "ratio": 1.2,
                              "ci_low": 1.1, "ci_high": 1.3, "lesson": "compile: kept", "quality_passed": True,
                              "ledger_seq": 7}],
             "rejected": [], "refusals": [],
             "final": {"objective_median": 1200.0, "stock_median_same_run": 1000.0, "ratio": 1.2, "ci_low": 1.1,
                       "ci_high": 1.3, "n_pairs": 7, "protocol_verdict": "keep", "quality_passed": True,
                       "quality_failed": [], "ledger_seq": 24}}


def _key(i: int) -> dict[str, str]:
    return {"model": f"model-{i % 5000}", "hardware": f"gpu-{i % 7}", "framework": ("transformers", "vllm")[i % 2],
            "model_type": ("llama", "qwen2", "mistral")[i % 3], "architecture": f"Arch{i % 11}ForCausalLM",
            "framework_version": f"5.{i % 13}.0", "precision": ("bfloat16", "float16", "float32")[i % 3]}


def _rows(lo: int, hi: int, now: float) -> Iterator[dict[str, Any]]:
    for i in range(lo, hi):
        yield {**_key(i), "status": "ok", "winner_config": json.dumps({"compile_mode": "default"}),
               "winner_changes": json.dumps({"compile_mode": "default"}), "ratio": 1.0 + (i % 50) / 100,
               "ci_low": 1.0, "ci_high": 1.6, "stock_objective": 1000.0, "final_objective": 1200.0, "n_pairs": 5,
               "winner_session_id": f"s{i}", "winner_evidence": "{}", "winner_at": now, "sessions": "[]",
               "worked": "[]", "failed": "[]", "lessons": "[]", "created_at": now, "updated_at": now}


def seed(store: RecipeStore, n: int, chunk: int = 20_000) -> None:
    """N recipes, ``chunk`` rows per transaction (memory stays flat at 1M)."""
    now = time.time()
    for j in range(0, n, chunk):
        with store.db.write() as conn:
            conn.execute(recipes.insert(), list(_rows(j, min(n, j + chunk), now)))
    if not store.db.is_sqlite:
        with store.db.engine.connect() as conn:
            conn.exec_driver_sql("ANALYZE recipes")
            conn.commit()


def lookups(store: RecipeStore, n_recipes: int, n: int) -> dict[str, list[float]]:
    rng = random.Random(0)
    cases = {
        "exact hit (tier 0)": lambda: WorkloadKey(**_key(rng.randrange(n_recipes))),
        "relaxed hit (framework version and hardware relaxed: tier 2)": lambda: WorkloadKey(
            **{**_key(rng.randrange(n_recipes)), "framework_version": "9.9", "hardware": "new-gpu"}),
        "miss on every tier (precision is never relaxed)": lambda: WorkloadKey(
            **{**_key(rng.randrange(n_recipes)), "precision": "fp8"}),
    }
    out: dict[str, list[float]] = {}
    for name, make in cases.items():
        for _ in range(5):  # warm the cache and the pool
            store.lookup(make())
        times = []
        for _ in range(n):
            k = make()
            t = time.perf_counter()
            store.lookup(k)
            times.append((time.perf_counter() - t) * 1000)
        out[name] = sorted(times)
    return out


def _writer(url: str, worker: int, n: int, shared: bool, q: Any) -> None:
    with RecipeStore(url) as store:
        t = time.perf_counter()
        for i in range(n):
            key = WorkloadKey(**({**_key(0), "model": "shared-model"} if shared else
                                 {**_key(i), "model": f"new-{worker}-{i}"}))
            store.record_session(key, BREAKDOWN, f"w{worker}-s{i}-{'shared' if shared else 'own'}")
        q.put(time.perf_counter() - t)


def write_rate(url: str, writers: int, per_writer: int, shared: bool) -> tuple[float, int]:  # (rate, sessions)
    """Sessions filed per second by ``writers`` processes (wall clock of the slowest)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(url, w, per_writer, shared, q)) for w in range(writers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise SystemExit(f"a writer failed (exit codes {[p.exitcode for p in procs]})")
    spans = [q.get() for _ in procs]
    return writers * per_writer / max(spans), writers * per_writer


def bench(label: str, url: str, args: argparse.Namespace) -> None:
    store = RecipeStore(url)
    t0 = time.perf_counter()
    seed(store, args.recipes)
    took = time.perf_counter() - t0
    print(f"\n### {label}: seeded {args.recipes:,} recipes in {took:.1f} s ({args.recipes / took:,.0f} rows/s, bulk)")
    print("\n| lookup | median ms | p95 ms | n |\n| --- | --- | --- | --- |")
    for name, times in lookups(store, args.recipes, args.lookups).items():
        print(f"| {name} | {statistics.median(times):.2f} | {times[int(0.95 * len(times)) - 1]:.2f} | {len(times)} |")
    store.close()
    if args.writes:
        print("\n| record_session writers | recipes | sessions | sessions/s |\n| --- | --- | --- | --- |")
        for w in sorted({1, args.writers}):
            for shared in (False, True):
                rate, n = write_rate(url, w, max(1, args.writes // w), shared)
                what = "one shared recipe (row lock)" if shared else "a new recipe each (insert)"
                print(f"| {w} | {what} | {n} | {rate:,.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", type=int, default=100_000)
    ap.add_argument("--lookups", type=int, default=200)
    ap.add_argument("--backend", action="append", choices=["sqlite", "pg-throwaway"],
                    help="a fresh KB of this kind (repeatable; default sqlite unless --url)")
    ap.add_argument("--url", action="append", default=[], help="also an existing, empty KB at this SQL URL")
    ap.add_argument("--writes", type=int, default=0, help="sessions to file per write-rate case (0: none)")
    ap.add_argument("--writers", type=int, default=4, help="concurrent writer processes for the second case")
    args = ap.parse_args()
    backends = args.backend or ([] if args.url else ["sqlite"])
    for b in backends:
        if b == "sqlite":
            path = Path(tempfile.mkdtemp()) / "kb.sqlite"
            bench("SQLite (WAL, synchronous=FULL)", f"sqlite:///{path}", args)
            print(f"\nSQLite file: {path.stat().st_size / 1e6:.0f} MB")
        else:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
            from pg_cluster import PgCluster, find_bin  # the tests' throwaway cluster

            bindir = find_bin()
            if bindir is None:
                raise SystemExit("pg-throwaway: no PostgreSQL binaries (/usr/lib/postgresql/*/bin); "
                                 "apt-get install postgresql")
            cluster = PgCluster(bindir, fsync=True)  # durable commits, like SQLite's synchronous=FULL
            try:
                bench(f"PostgreSQL {bindir.parts[-2]} (throwaway cluster, local TCP, fsync on)",
                      cluster.new_database(), args)
            finally:
                cluster.destroy()
    for url in args.url:
        bench(url.split("@")[-1], url, args)


if __name__ == "__main__":
    main()
