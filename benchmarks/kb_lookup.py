"""Lookup time of the recipe knowledge base at 100k recipes (issue 4; target <= 5 ms).

Seeds a fresh SQLite KB with N recipes (bulk insert straight into the recipes
table, spread over many models, devices and versions so every tier has
competitors), then times `RecipeStore.lookup` for keys that hit exactly, hit
only after relaxing, and miss everywhere; median and p95 of each.

    .venv/bin/python benchmarks/kb_lookup.py --recipes 100000 --lookups 200
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from inferloom.kb import RecipeStore, WorkloadKey
from inferloom.kb.db import recipes


def _key(i: int) -> dict[str, str]:
    return {"model": f"model-{i % 5000}", "hardware": f"gpu-{i % 7}", "framework": ("transformers", "vllm")[i % 2],
            "model_type": ("llama", "qwen2", "mistral")[i % 3], "architecture": f"Arch{i % 11}ForCausalLM",
            "framework_version": f"5.{i % 13}.0", "precision": ("bfloat16", "float16", "float32")[i % 3]}


def seed(store: RecipeStore, n: int) -> None:
    now = time.time()
    rows = []
    for i in range(n):
        rows.append({**_key(i), "status": "ok", "winner_config": json.dumps({"compile_mode": "default"}),
                     "winner_changes": json.dumps({"compile_mode": "default"}), "ratio": 1.0 + (i % 50) / 100,
                     "ci_low": 1.0, "ci_high": 1.6, "stock_objective": 1000.0, "final_objective": 1200.0, "n_pairs": 5,
                     "winner_session_id": f"s{i}", "winner_evidence": "{}", "winner_at": now, "sessions": "[]",
                     "worked": "[]", "failed": "[]", "lessons": "[]", "created_at": now, "updated_at": now})
    with store.db.write() as conn:
        for j in range(0, n, 5000):
            conn.execute(recipes.insert(), rows[j:j + 5000])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", type=int, default=100_000)
    ap.add_argument("--lookups", type=int, default=200)
    args = ap.parse_args()
    path = Path(tempfile.mkdtemp()) / "kb.sqlite"
    store = RecipeStore(f"sqlite:///{path}")
    t0 = time.perf_counter()
    seed(store, args.recipes)
    print(f"seeded {args.recipes:,} recipes in {time.perf_counter() - t0:.1f} s ({path.stat().st_size / 1e6:.1f} MB)")
    rng = random.Random(0)
    cases = {
        "exact hit": lambda: WorkloadKey(**_key(rng.randrange(args.recipes))),
        "relaxed hit (new framework_version + hardware)": lambda: WorkloadKey(**{**_key(rng.randrange(args.recipes)),
                                                                               "framework_version": "9.9", "hardware": "new-gpu"}),
        "miss (unknown precision)": lambda: WorkloadKey(**{**_key(rng.randrange(args.recipes)), "precision": "fp8"}),
    }
    print(f"\n| lookup | median ms | p95 ms | n |\n| --- | --- | --- | --- |")
    for name, make in cases.items():
        times = []
        for _ in range(args.lookups):
            k = make()
            t = time.perf_counter()
            store.lookup(k)
            times.append((time.perf_counter() - t) * 1000)
        times.sort()
        print(f"| {name} | {statistics.median(times):.2f} | {times[int(0.95 * len(times)) - 1]:.2f} | {len(times)} |")
    store.close()


if __name__ == "__main__":
    main()
