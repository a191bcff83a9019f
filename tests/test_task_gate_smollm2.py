"""The task gate on the real trained model (SmolLM2-135M-Instruct) with the transformers engine: real
text traffic and quality prompts (examples/real-model-cpu/texts.jsonl) and the shipped task set
(``quality.task.file: smollm2-135m-instruct``). `inferloom bench --aa` passes the task gate with a drop
bound of exactly 0 (stock answers every item the same way twice); a numerics-changing candidate
(bfloat16 against float32 stock) is judged by the numerics tolerance and the task gate on both splits,
its recorded b / c counts consistent with its verdict. The vLLM twin: tests/test_vllm_prompts_real.py."""

from __future__ import annotations

import pytest
from _smollm2 import NAME, TEXTS, bench, require_smollm2, task_values_consistent

pytestmark = pytest.mark.slow


def _flat(**more):
    return {"model": NAME, "framework": "transformers", "device": "cpu", "dtype": "float32",
            # concurrency 8 (micro_batch 8): the task items go in 10 generate() calls, not 40; one batch per run
            "traffic.concurrency": 8, "traffic.num_prompts": 8, "traffic.input_len": 32, "traffic.output_len": 8,
            "traffic.prompts": str(TEXTS),
            "quality.prompts_file": str(TEXTS), "quality.eval_prompts": 4, "quality.heldout_prompts": 4,
            "quality.prompt_len": 16, "quality.continuation_len": 8,
            "quality.task": {"file": NAME, "max_new_tokens": 6}, "quality.numerics": {},
            "protocol.min_pairs": 3, "protocol.max_pairs": 3, **more}


def test_aa_and_a_bf16_candidate_through_the_task_gate_on_smollm2(tmp_path):
    require_smollm2()
    aa = bench(tmp_path, _flat(), "--aa", name="aa")
    q = aa["quality"]
    assert q["evaluated"] and q["passed"], q
    assert {s["set_name"] for s in q["sets"]} == {"eval", "heldout"}
    for s in q["sets"]:
        v = s["values"]
        assert v["task_n"] == 40 and v["task_drop_upper"] == 0.0 and v["task_lost"] == v["task_gained"] == 0, s
        assert 0.2 <= v["task_accuracy_stock"] <= 0.9 and v["task_accuracy"] == v["task_accuracy_stock"]
        task_values_consistent(s, 0.02)
    assert aa["verdict"] == "noise-measured"

    cand = bench(tmp_path, _flat(), "--candidate", "dtype=bfloat16", name="bf16")
    q = cand["quality"]
    assert q["evaluated"] and q["tolerance"]["name"] == "numerics", q
    assert "dtype float32 -> bfloat16" in q["tolerance"]["why"]
    stock_acc = {s["set_name"]: s["values"]["task_accuracy_stock"] for s in aa["quality"]["sets"]}
    for s in q["sets"]:
        assert s["values"]["task_accuracy_stock"] == stock_acc[s["set_name"]]  # the same stock answers
        task_values_consistent(s, 0.02)
    assert q["passed"] == all(s["passed"] for s in q["sets"])
