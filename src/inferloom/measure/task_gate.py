"""The task-accuracy gate of the quality contract (``quality.task`` in the spec).

A declared eval of prompts with exact answers (JSONL, each item in the
``eval`` or ``heldout`` split) is answered greedily by stock and by the
candidate through the adapter's real generation path (the transformers
engine's generate(); a server's completions, one request per item at
``quality.concurrency`` with a fresh ``cache_salt``, as every server probe);
an item is correct when the generated text up to the first newline (or the
first end-of-sequence token) equals its answer. The two per-item correctness
vectors are compared *paired*:

* ``b`` = items stock got right and the candidate wrong, ``c`` = the reverse;
* the exact McNemar p-value (two-sided binomial test of ``b`` vs ``c``) is
  reported;
* the decision is a one-sided upper confidence bound on the accuracy drop,
  ``(b + c) / n * (2 * pi_up - 1)``, where ``pi_up`` is the Clopper-Pearson
  upper bound of ``b / (b + c)`` (the same conditioning on the discordant
  pairs as the exact McNemar test). The candidate passes when that bound is
  at most the declared ``max_drop``: "at most ``max_drop`` lower with
  ``confidence``". Identical answers give a bound of exactly 0.

Kept apart from ``quality.py`` (the distribution checks); :func:`merge_task`
folds a task result into a :class:`~inferloom.measure.quality.QualityVerdict`,
beside KL, top-1 and greedy agreement.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from inferloom.inputs import InputError, decode_utf8, load_json
from inferloom.measure.quality import QualityVerdict

__all__ = [
    "TaskItem",
    "TaskReference",
    "load_task_items",
    "answer_of",
    "answer_ids",
    "score_task",
    "task_answers",
    "paired_drop",
    "capture_task_reference",
    "evaluate_task",
    "merge_task",
]

SPLITS = ("eval", "heldout")


@dataclass(frozen=True)
class TaskItem:
    prompt: str
    answer: str
    task: str = ""


@dataclass
class TaskReference:
    set_name: str
    items: list[TaskItem]
    stock_correct: list[int]


def load_task_items(path: str | Path) -> dict[str, list[TaskItem]]:
    """The items of a task eval file by split (``eval``, ``heldout``); a
    ValueError naming the file, line and problem otherwise."""
    p = Path(path)
    try:
        text = decode_utf8(p.read_bytes())
    except (OSError, InputError) as exc:
        raise ValueError(f"task eval '{p}': cannot be read ({exc}); expected a UTF-8 JSONL file") from None
    out: dict[str, list[TaskItem]] = {s: [] for s in SPLITS}
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = load_json(line)
        except InputError as exc:
            raise ValueError(f"task eval '{p}' line {i}: {exc}") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not isinstance(row.get("answer"), str):
            raise ValueError(f"task eval '{p}' line {i}: expected an object with string 'prompt' and 'answer'")
        split = row.get("split", "eval")
        if split not in SPLITS:
            raise ValueError(f"task eval '{p}' line {i}: split {split!r}, expected 'eval' or 'heldout'")
        out[split].append(TaskItem(row["prompt"], row["answer"].strip(), str(row.get("task", ""))))
    for s in SPLITS:
        if not out[s]:
            raise ValueError(f"task eval '{p}': no items in the '{s}' split; every split needs items")
    return out


def answer_of(text: str) -> str:
    """The generated answer: the text up to the first newline, stripped."""
    return text.split("\n", 1)[0].strip()


def score_task(adapter: Any, handle: Any, items: Sequence[TaskItem], max_new_tokens: int) -> list[int]:
    """Per item 1 if the configuration's greedy answer is exact, else 0
    (through ``adapter.greedy``: its real generation path; a server's is its
    completions, one request per item at ``quality.concurrency``).

    The prompts are the adapter's tokenizer's ids of the item text, ``tok(text)``
    as the tokenizer has it (a BOS only where that tokenizer adds one), sent as
    token ids: every engine that loads the model directory's tokenizer scores
    the same ids. The greedy paths generate exactly ``max_new_tokens`` (EOS
    suppressed, ``ignore_eos`` on a server), so the answer is cut at the first
    end-of-sequence token should one appear (:func:`answer_ids`), then at the
    first newline (:func:`answer_of`)."""
    return [int(a == it.answer) for it, a in zip(items, task_answers(adapter, handle, items, max_new_tokens))]


def task_answers(adapter: Any, handle: Any, items: Sequence[TaskItem], max_new_tokens: int) -> list[str]:
    """The configuration's greedy answer to each item (see :func:`score_task`)."""
    tok = getattr(adapter, "tokenizer", None)
    if tok is None:
        raise ValueError(f"task gate: the {type(adapter).__name__} adapter has no tokenizer to encode the task prompts")
    prompts = [list(tok(it.prompt)["input_ids"]) for it in items]
    conts = adapter.greedy(handle, prompts, max_new_tokens)
    stop = _stop_ids(tok)
    return [answer_of(tok.decode(answer_ids(c, stop), skip_special_tokens=True)) for c in conts]


def _stop_ids(tok: Any) -> set[int]:
    eos = getattr(tok, "eos_token_id", None)
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if isinstance(e, int)}


def answer_ids(ids: Sequence[int], stop: set[int]) -> list[int]:
    """``ids`` up to (without) the first id in ``stop``: what a continuation generated past its end of
    sequence (``ignore_eos``, ``min_tokens``) is not part of the answer."""
    out: list[int] = []
    for t in ids:
        if int(t) in stop:
            break
        out.append(int(t))
    return out


def paired_drop(stock: Sequence[int], cand: Sequence[int], confidence: float) -> dict[str, float]:
    """Pure: accuracies, discordant counts, the exact McNemar p-value and the
    one-sided upper bound of the accuracy drop (stock minus candidate)."""
    from scipy.stats import beta, binomtest

    if len(stock) != len(cand) or not stock:
        raise ValueError(f"task gate: {len(stock)} stock results but {len(cand)} candidate ones (need equal, non-zero)")
    n = len(stock)
    b = sum(1 for s, c in zip(stock, cand) if s and not c)
    c = sum(1 for s, x in zip(stock, cand) if x and not s)
    d = b + c
    pi_up = 1.0 if c == 0 else float(beta.ppf(confidence, b + 1, c))
    return {
        "task_n": float(n),
        "task_accuracy_stock": sum(stock) / n,
        "task_accuracy": sum(cand) / n,
        "task_drop": (b - c) / n,
        "task_drop_upper": 0.0 if d == 0 else d / n * (2 * pi_up - 1),
        "task_lost": float(b),
        "task_gained": float(c),
        "task_mcnemar_p": 1.0 if d == 0 else float(binomtest(b, d, 0.5).pvalue),
    }


def capture_task_reference(adapter: Any, handle: Any, set_name: str, items: list[TaskItem],
                           max_new_tokens: int) -> TaskReference:
    return TaskReference(set_name, items, score_task(adapter, handle, items, max_new_tokens))


def evaluate_task(adapter: Any, handle: Any, ref: TaskReference, gate: Any) -> dict[str, Any]:
    """Score the candidate on the reference's items and judge it against
    ``gate`` (a :class:`~inferloom.spec.TaskGateSpec`)."""
    cand = score_task(adapter, handle, ref.items, gate.max_new_tokens)
    values = paired_drop(ref.stock_correct, cand, gate.confidence)
    passed = values["task_drop_upper"] <= gate.max_drop
    msg = (f"{ref.set_name}: task accuracy {values['task_accuracy']:.3f} vs stock {values['task_accuracy_stock']:.3f} "
           f"({int(values['task_lost'])} lost, {int(values['task_gained'])} gained of {len(ref.items)}); "
           f"drop upper bound {values['task_drop_upper']:.4f} at {gate.confidence:g} confidence, "
           f"{'within' if passed else 'over'} the declared max_drop {gate.max_drop:g}")
    return {"passed": passed, "values": values, "message": msg,
            "thresholds": {"task_max_drop": gate.max_drop, "task_confidence": gate.confidence}}


def merge_task(verdict: QualityVerdict, task: dict[str, Any]) -> QualityVerdict:
    """Fold a task result into ``verdict``: its values beside the
    distribution checks; a failed task gate fails the verdict (named
    ``task_accuracy`` unless an earlier check already failed)."""
    verdict.values.update(task["values"])
    verdict.thresholds.update(task["thresholds"])
    verdict.details["task"] = task["message"]
    if not task["passed"] and verdict.passed:
        verdict.passed = False
        verdict.failed_check = "task_accuracy"
        verdict.message = task["message"]
    elif not task["passed"]:
        verdict.message += "; " + task["message"]
    return verdict
