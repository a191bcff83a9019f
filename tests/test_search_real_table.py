"""benchmarks/search_efficiency_real.py (issue 15, part (b)): the real engine measured in shards, the
shards read back as one table, the searchers run over it. Real llama-tiny runs, tiny traffic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "search_efficiency_real.py"
sys.path.insert(0, str(ROOT / "benchmarks"))


def _measure(out: Path, shard: str) -> None:
    subprocess.run([sys.executable, str(SCRIPT), "measure", "--out", str(out), "--pairs", "2", "--shard", shard,
                    "--set", "traffic.output_len=2", "--set", "traffic.num_prompts=2"],
                   check=True, cwd=ROOT, capture_output=True, text=True, timeout=600,
                   env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    d = tmp_path_factory.mktemp("search-real")
    paths = [d / "table-0.json", d / "table-1.json"]
    for k, p in enumerate(paths):
        _measure(p, f"{k}/80")  # 84 feasible configurations: one (two for shard 0) each, and stock's A/A
    return paths


def test_each_shard_measures_stock_first_and_records_its_configuration(shards: list[Path]) -> None:
    from search_efficiency_real import table_stock

    for p in shards:
        t = json.loads(p.read_text())
        rows = list(t["rows"].values())
        assert rows[0]["config"] == t["meta"]["stock"]  # stock's A/A first: a cut shard still has it
        assert len(rows) == t["meta"]["configs"] == t["meta"]["measured"]
        assert all(len(r["pairs_tok_s"]) == 2 and "errors" in r for r in rows)
        assert table_stock(t, []) == t["meta"]["stock"]
        assert t["meta"]["spec"]["traffic.output_len"] == 2


def test_shards_read_back_as_one_table_with_stock_pooled(shards: list[Path]) -> None:
    from search_efficiency_real import load_tables

    parts = [json.loads(p.read_text()) for p in shards]
    merged = load_tables([str(p) for p in shards])
    stock_key = next(iter(parts[0]["rows"]))
    assert len(merged["rows"]) == len(set(parts[0]["rows"]) | set(parts[1]["rows"]))
    assert merged["rows"][stock_key]["ratios"] == parts[0]["rows"][stock_key]["ratios"] + parts[1]["rows"][stock_key]["ratios"]
    assert merged["meta"]["configs"] == parts[0]["meta"]["configs"] + parts[1]["meta"]["configs"]
    assert [m["shard"] for m in merged["meta"]["shards"]] == ["0/80", "1/80"]


def test_search_runs_every_strategy_over_the_shards(shards: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "search", "--table", *map(str, shards), "--seeds", "2",
                        "--budget", "5", "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())["results"]
    assert len(res) >= 8 and all(0.0 <= v["best_fraction"]["5"] <= 1.0 for v in res.values())


def test_search_says_so_when_the_stock_row_is_missing(shards: list[Path], tmp_path: Path) -> None:
    t = json.loads(shards[1].read_text())
    stock_key = next(iter(t["rows"]))
    del t["rows"][stock_key]
    t["meta"].pop("stock")
    t["meta"].pop("shard")  # an older table: stock from the knobs' defaults, which it lacks
    p = tmp_path / "no-stock.json"
    p.write_text(json.dumps(t))
    r = subprocess.run([sys.executable, str(SCRIPT), "search", "--table", str(p), "--seeds", "1", "--budget", "5"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert r.returncode != 0 and "no stock row" in r.stderr
