"""The task gate and the quality contract on the real transformers engine with
the trained preset (llama-tiny-trained): a harmless change passes, real damage
(a dropped layer, heavy weight noise) fails. A bench of a numerics-changing
candidate (which tolerance it was judged against, the task values on both
splits) runs on the real SmolLM2 model: tests/test_task_gate_smollm2.py."""

import json

import pytest
import torch

from inferloom.measure import quality as Q
from inferloom.measure import task_gate as TG
from inferloom.models.trained import task_eval_file, trained_preset_dir
from inferloom.spec import load_spec
from inferloom.workloads.transformers_engine import TransformersEngine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    items = [json.loads(x) for x in task_eval_file("llama-tiny-trained").read_text().splitlines()]
    small = tmp_path_factory.mktemp("tasks") / "tasks.jsonl"  # 40 items per split keeps the test fast
    keep = [it for s in ("eval", "heldout") for it in [i for i in items if i["split"] == s][:40]]
    small.write_text("".join(json.dumps(it) + "\n" for it in keep))
    spec = load_spec(None, {"model": "llama-tiny-trained", "device": "cpu", "traffic.concurrency": 4,
                            "traffic.input_len": 16, "traffic.output_len": 8, "traffic.num_prompts": 4,
                            "quality.eval_prompts": 4, "quality.heldout_prompts": 4, "quality.prompt_len": 16,
                            "quality.continuation_len": 8, "quality.task": {"file": str(small)},
                            "protocol.min_pairs": 3, "protocol.max_pairs": 3})
    eng = TransformersEngine(spec)
    stock = eng.prepare({})
    gate = spec.quality.task
    ref = TG.capture_task_reference(eng, stock, "eval", TG.load_task_items(gate.file)["eval"], gate.max_new_tokens)
    qref = Q.capture_reference(eng, stock, "eval", Q.quality_prompt_sets(spec, eng)["eval"], 8)
    eng.release(stock)
    yield spec, eng, ref, qref
    eng.close()


def _judge(spec, eng, ref, qref, cfg, damage=None):
    h = eng.prepare(cfg)
    try:
        if damage is not None:
            with torch.no_grad():
                damage(h.model)
        v = Q.evaluate(eng, h, qref, Q.QualityThresholds.from_spec(spec.quality))
        return TG.merge_task(v, TG.evaluate_task(eng, h, ref, spec.quality.task))
    finally:
        eng.release(h)


def test_the_trained_model_knows_its_tasks(setup):
    _, _, ref, _ = setup
    assert sum(ref.stock_correct) / len(ref.stock_correct) > 0.3  # random weights score 0


def test_a_harmless_change_passes_the_task_gate(setup):
    v = _judge(*setup, {"attn_implementation": "eager"})
    assert v.passed, v.message
    assert v.values["task_drop_upper"] <= 0.02 and "task_accuracy" in v.values and "mean_kl" in v.values


def test_a_dropped_layer_fails_the_task_gate(setup):
    def drop(model):
        model.model.layers[2].self_attn.o_proj.weight.zero_()
        model.model.layers[2].mlp.down_proj.weight.zero_()

    v = _judge(*setup, {}, drop)
    assert not v.passed
    assert v.values["task_drop_upper"] > 0.02 and v.values["task_lost"] > v.values["task_gained"]
    assert "task accuracy" in v.details["task"]


def test_the_preset_directory_holds_its_training_log():
    log = json.loads((trained_preset_dir("llama-tiny-trained") / "train_log.json").read_text())
    assert set(log["accuracy_heldout_prompts"]["heldout"]) == {"add", "sort", "recall"}
    assert log["train_wall_s"] > 0 and log["loadavg_samples_1m_5m_15m"]
