"""The task-accuracy gate (pure parts), the numerics tolerance, their spec
fields, and the trained preset's tasks and tokenizer. The real-engine test is
tests/test_task_gate_engine.py."""

import json

import pytest

from inferloom.measure import task_gate as TG
from inferloom.measure.quality import QualityVerdict
from inferloom.measure.tolerance import EXACT, NUMERICS, numerics_changes, tolerance_for
from inferloom.models import tiny_tasks as T
from inferloom.spec import SpecError, load_spec


def test_paired_drop_identical_is_zero_and_passes_any_tolerance():
    d = TG.paired_drop([1, 0, 1, 1], [1, 0, 1, 1], 0.95)
    assert d["task_drop_upper"] == 0.0 and d["task_mcnemar_p"] == 1.0 and d["task_accuracy"] == 0.75


def test_paired_drop_counts_discordant_pairs_and_bounds_the_drop():
    stock = [1] * 90 + [0] * 10
    cand = [0] * 5 + [1] * 85 + [0] * 10  # lost 5, gained none
    d = TG.paired_drop(stock, cand, 0.95)
    assert (d["task_lost"], d["task_gained"]) == (5, 0)
    assert d["task_drop"] == pytest.approx(0.05)
    assert d["task_drop_upper"] == pytest.approx(0.05)  # all discordant pairs lost: pi_up = 1
    assert d["task_mcnemar_p"] == pytest.approx(0.0625)  # exact two-sided binomial, 5 of 5
    balanced = TG.paired_drop([1, 0] * 50, [0, 1] * 50, 0.95)  # as many lost as gained
    assert balanced["task_drop"] == 0.0 and 0 < balanced["task_drop_upper"] < 0.2


def test_paired_drop_refuses_mismatched_lengths():
    with pytest.raises(ValueError, match="1 stock results but 2 candidate"):
        TG.paired_drop([1], [1, 0], 0.95)


class _Gate:
    max_drop, confidence, max_new_tokens = 0.02, 0.95, 4


def test_merge_task_fails_a_passing_verdict_and_names_the_check():
    v = QualityVerdict("eval", True, None, "eval: all checks passed", {"mean_kl": 0.0}, {}, 2, 8)
    res = {"passed": False, "values": TG.paired_drop([1] * 10, [0] * 10, 0.95), "message": "eval: task accuracy ...",
           "thresholds": {"task_max_drop": 0.02}}
    out = TG.merge_task(v, res)
    assert not out.passed and out.failed_check == "task_accuracy" and out.values["task_accuracy"] == 0.0
    assert out.values["mean_kl"] == 0.0  # reported beside the distribution checks


def test_answer_of_takes_the_first_line():
    assert TG.answer_of("405\n12+3=") == "405" and TG.answer_of(" 7 ") == "7"


def test_load_task_items_splits_and_rejects_bad_lines(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text("\n".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1), "split": s})
                           for i, s in enumerate(["eval", "heldout", "eval"])) + "\n")
    items = TG.load_task_items(f)
    assert [len(items["eval"]), len(items["heldout"])] == [2, 1]
    f.write_text(json.dumps({"prompt": "1+1=", "answer": 2}) + "\n")
    with pytest.raises(ValueError, match="line 1: expected an object with string 'prompt' and 'answer'"):
        TG.load_task_items(f)
    f.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    with pytest.raises(ValueError, match="no items in the 'heldout' split"):
        TG.load_task_items(f)


def test_numerics_tolerance_applies_only_to_watched_knob_changes(tmp_path):
    spec = load_spec(None, {"quality.numerics": {"max_mean_kl": 0.2}})
    th, why = tolerance_for(spec.quality, {"dtype": "float32", "micro_batch": 8}, {"dtype": "bfloat16", "micro_batch": 8})
    assert why["name"] == NUMERICS and th.max_mean_kl == 0.2 and why["why"].startswith("dtype float32 -> bfloat16: quality.numerics")
    th, why = tolerance_for(spec.quality, {"dtype": "float32", "micro_batch": 8}, {"dtype": "float32", "micro_batch": 1})
    assert why["name"] == EXACT and th.max_mean_kl == 0.01
    plain = load_spec(None, {})
    assert tolerance_for(plain.quality, {"dtype": "float32"}, {"dtype": "bfloat16"})[1]["name"] == EXACT
    assert numerics_changes({"a": 1}, {"a": 2, "b": 3}, ["a", "b"]) == ["a 1 -> 2", "b None -> 3"]


def test_spec_task_section_resolves_a_trained_preset_and_refuses_a_missing_file(tmp_path):
    spec = load_spec(None, {"quality.task": {"file": "llama-tiny-trained", "max_drop": 0.01}})
    assert spec.quality.task.file.endswith("llama-tiny-trained/tasks.jsonl") and spec.quality.task.max_drop == 0.01
    with pytest.raises(SpecError, match="quality.task.file.*not found"):
        load_spec(None, {"quality.task": {"file": str(tmp_path / "none.jsonl")}})
    y = tmp_path / "s.yaml"
    y.write_text("model: llama-tiny-trained\nquality:\n  task: {file: llama-tiny-trained}\n")
    s = load_spec(y)
    assert s.model.endswith("data/llama-tiny-trained") and s.quality.task.file.endswith("tasks.jsonl")


def test_tasks_have_exact_answers_and_a_fixed_split():
    import random

    rng = random.Random(1)
    for task in T.TASKS:
        prompt, answer = T.make_example(task, rng)
        if task == "add":
            a, b = prompt[:-1].split("+")
            assert int(answer) == int(a) + int(b)
        elif task == "sort":
            assert answer == "".join(sorted(prompt[5:-1]))
    items = T.eval_items(4)
    assert all(T.split_of(it["prompt"]) == it["split"] for it in items)
    assert len({it["prompt"] for it in items}) == len(items) == 24
    train = [p for _, p, _ in __import__("itertools").islice(T.examples(0), 300)]
    assert not {p for p in train} & {it["prompt"] for it in items}


def test_char_tokenizer_round_trips_digits_one_token_each():
    tok = T.build_char_tokenizer()
    ids = tok("12+3=\n")["input_ids"]
    assert ids[0] == 1 and len(ids) == 7 and tok.decode(ids, skip_special_tokens=True) == "12+3=\n"


def test_spec_refuses_a_task_gate_without_a_tokenizer_and_greedy_path_and_takes_vllm():
    for fw, model in (("synthetic", "llama-tiny"), ("diffusers", "sd3-tiny")):  # custom: the same rule
        with pytest.raises(SpecError, match=f"quality.task .*needs framework transformers, vllm or sglang, got {fw}"):
            load_spec(None, {"framework": fw, "model": model, "quality.task": {"file": "llama-tiny-trained"}})
    spec = load_spec(None, {"framework": "vllm", "quality.task": {"file": "smollm2-135m-instruct"}})
    assert spec.quality.task.file.endswith("data/tasks/smollm2-135m-instruct.jsonl")


def test_the_shipped_smollm2_set_has_both_splits_eight_tasks_and_no_chat_template(tmp_path):
    from inferloom.models.trained import TASK_SETS, task_eval_file
    from inferloom.spec.paths import resolve_spec_paths

    items = TG.load_task_items(task_eval_file("smollm2-135m-instruct"))
    assert [len(items["eval"]), len(items["heldout"])] == [40, 40]
    for split in items.values():
        assert {it.task for it in split} == {"add", "capital", "antonym", "plural", "sequence", "upper", "past", "letter"}
        assert all("<|im_start|>" not in it.prompt and it.prompt.count("\n") == 4 for it in split)
    assert not {it.prompt for it in items["eval"]} & {it.prompt for it in items["heldout"]}
    assert resolve_spec_paths({"quality": {"task": {"file": "smollm2-135m-instruct"}}}, tmp_path) == \
        {"quality": {"task": {"file": "smollm2-135m-instruct"}}}  # a name, not a path next to the spec
    assert set(TASK_SETS) == {"llama-tiny-trained", "smollm2-135m-instruct"}
    with pytest.raises(ValueError, match="unknown task set 'nope'"):
        task_eval_file("nope")


def test_the_generator_writes_the_shipped_file_again(tmp_path):
    import importlib.util
    from pathlib import Path

    from inferloom.models.trained import task_eval_file

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "smollm2_tasks.py"
    spec = importlib.util.spec_from_file_location("smollm2_tasks", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.write(tmp_path / "t.jsonl", 0)
    assert (tmp_path / "t.jsonl").read_text() == task_eval_file("smollm2-135m-instruct").read_text()


class _Tok:
    """Ids are characters; 0 is the end of sequence."""
    eos_token_id = 0

    def __call__(self, text):
        return {"input_ids": [ord(ch) for ch in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == 0))


class _Adapter:
    tokenizer = _Tok()

    def __init__(self, conts):
        self.conts, self.prompts = conts, None

    def greedy(self, handle, prompts, n):
        self.prompts = prompts
        return [[ord(ch) if isinstance(ch, str) else ch for ch in c][:n] for c in self.conts]


def test_a_continuation_past_its_end_of_sequence_is_not_part_of_the_answer():
    items = [TG.TaskItem("a=", "7"), TG.TaskItem("b=", "8"), TG.TaskItem("c=", "9")]
    # " 7" then EOS then more text (ignore_eos / min_tokens go on generating); " 8\n..."; " 9" then EOS then "9"
    a = _Adapter([[" ", "7", 0, "1", "2"], [" ", "8", "\n", "x", "y"], [" ", "9", 0, "9", "\n"]])
    assert TG.task_answers(a, None, items, 5) == ["7", "8", "9"]
    assert TG.score_task(a, None, items, 5) == [1, 1, 1]
    assert a.prompts == [[97, 61], [98, 61], [99, 61]]  # tok(prompt) as the tokenizer has it
    assert TG.answer_ids([5, 3, 0, 4], {0}) == [5, 3] and TG.answer_ids([5, 3], set()) == [5, 3]


def test_the_report_says_which_tolerance_a_kept_change_passed():
    from inferloom.report.breakdown import breakdown_from_ledger
    from inferloom.report.markdown import render_report
    from inferloom.session import ledger as L

    tol = {"name": "numerics", "why": "dtype float32 -> bfloat16: quality.numerics thresholds and the task gate"}
    entries = [{"kind": L.MEASUREMENT, "seq": 3, "ts": 1.0, "action": "try_config",
                "quality": {"evaluated": True, "passed": True, "tolerance": tol}},
               {"kind": L.VERDICT, "seq": 4, "ts": 2.0, "trial": 1, "cycle": 1, "changes": {"dtype": "bfloat16"}, "kept": True,
                "ratio": 1.2, "ci_low": 1.1, "ci_high": 1.3, "quality_passed": True, "measurement_seq": 3,
                "outcome": "keep", "lesson": ""}]
    b = breakdown_from_ledger(entries)
    assert b["action_path"][0]["quality_tolerance"].startswith("numerics tolerance (dtype float32 -> bfloat16")
    assert "quality passed the numerics tolerance (dtype float32 -> bfloat16" in render_report(b)
