"""Synthetic tasks with exact answers and the character-level tokenizer of the
trained tiny model (``llama-tiny-trained``, made by ``benchmarks/train_tiny.py``).

Three tasks, each a one-line prompt whose answer is a short exact string
ended by a newline:

* ``add``: ``"347+58="`` -> ``"405"`` (operands of 1 to 3 digits);
* ``sort``: ``"sort 7294="`` -> ``"2479"`` (3 to 7 digits);
* ``recall``: ``"a3 f7 x1 q5 ?f="`` -> ``"7"`` (4 to 8 key-value pairs).

The split is a pure function of the prompt text: a prompt whose CRC-32 is
divisible by :data:`HELDOUT_MOD` is held out (never trained on); held-out
prompts are halved again into the quality contract's ``eval`` and ``heldout``
sets. So the training script and the eval file agree without sharing state.

The tokenizer maps each character to one id (pad 0, bos 1, eos 2, as the
built BPE tokenizer does; see ``tokenizer.py``): digits are single tokens,
which a small model needs for arithmetic.
"""

from __future__ import annotations

import random
import string
import zlib
from typing import Any, Iterator

__all__ = [
    "TASKS",
    "HELDOUT_MOD",
    "CHAR_VOCAB_SIZE",
    "make_example",
    "split_of",
    "examples",
    "eval_items",
    "build_char_tokenizer",
]

TASKS = ("add", "sort", "recall")
HELDOUT_MOD = 8
CHAR_VOCAB_SIZE = 128
_SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>"]
_CHARS = ["\n"] + [chr(c) for c in range(32, 127)]


def make_example(task: str, rng: random.Random) -> tuple[str, str]:
    """One ``(prompt, answer)`` of ``task`` drawn from ``rng``."""
    if task == "add":
        a = rng.randrange(10 ** rng.randint(1, 3))
        b = rng.randrange(10 ** rng.randint(1, 3))
        return f"{a}+{b}=", str(a + b)
    if task == "sort":
        digits = [rng.choice(string.digits) for _ in range(rng.randint(3, 7))]
        return f"sort {''.join(digits)}=", "".join(sorted(digits))
    if task == "recall":
        keys = rng.sample(string.ascii_lowercase, rng.randint(4, 8))
        vals = [rng.choice(string.digits) for _ in keys]
        i = rng.randrange(len(keys))
        ctx = " ".join(k + v for k, v in zip(keys, vals))
        return f"{ctx} ?{keys[i]}=", vals[i]
    raise ValueError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")


def split_of(prompt: str) -> str:
    """``train``, or, for a held-out prompt, ``eval`` or ``heldout``."""
    h = zlib.crc32(prompt.encode())
    if h % HELDOUT_MOD:
        return "train"
    return "eval" if (h // HELDOUT_MOD) % 2 == 0 else "heldout"


def examples(seed: int, split: str = "train") -> Iterator[tuple[str, str, str]]:
    """Endless ``(task, prompt, answer)`` of one split, tasks in turn, from ``seed``."""
    rng = random.Random(seed)
    while True:
        for task in TASKS:
            while True:
                prompt, answer = make_example(task, rng)
                if split_of(prompt) == split:
                    yield task, prompt, answer
                    break


def eval_items(per_task: int, seed: int = 2026) -> list[dict[str, Any]]:
    """``per_task`` distinct held-out items of each task and each of the
    ``eval`` and ``heldout`` sets: the declared task eval of the trained model."""
    out: list[dict[str, Any]] = []
    for split in ("eval", "heldout"):
        seen: set[str] = set()
        counts = dict.fromkeys(TASKS, 0)
        for task, prompt, answer in examples(seed, split):
            if counts[task] >= per_task or prompt in seen:
                if all(c >= per_task for c in counts.values()):
                    break
                continue
            seen.add(prompt)
            counts[task] += 1
            out.append({"task": task, "split": split, "prompt": prompt, "answer": answer})
    return out


def build_char_tokenizer() -> Any:
    """A character-level ``PreTrainedTokenizerFast``: specials 0-2, then newline
    and printable ASCII, padded with unused tokens to :data:`CHAR_VOCAB_SIZE`;
    encoding prepends ``<|bos|>``; padding on the left."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(_SPECIALS + _CHARS)}
    for i in range(len(vocab), CHAR_VOCAB_SIZE):
        vocab[f"<|unused{i}|>"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|pad|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(_SPECIALS)
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>",
        padding_side="left", model_max_length=1 << 20, clean_up_tokenization_spaces=False)
