"""A tokenizer built locally: no model hub is reachable where inferloom runs.

For a synthetic preset, :func:`build_tokenizer` trains a byte-level BPE with the
``tokenizers`` library on the small corpus shipped in ``inferloom/data`` and
wraps it as a :class:`transformers.PreTrainedTokenizerFast`. Training is
deterministic; the result is cached on disk under
``$INFERLOOM_CACHE/tokenizers/<hash>/`` (default ``~/.cache/inferloom``), where
the hash covers the corpus, the vocabulary size and the recipe version.

For a local model directory, :func:`load_tokenizer` loads the directory's own
tokenizer files (``local_files_only=True``) and builds one only if it has none.

Special tokens (ids fixed by the recipe): ``<|pad|>`` = 0, ``<|bos|>`` = 1,
``<|eos|>`` = 2. Encoding prepends ``<|bos|>``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from inferloom.models.presets import PRESETS

__all__ = [
    "PAD_TOKEN",
    "BOS_TOKEN",
    "EOS_TOKEN",
    "PAD_ID",
    "BOS_ID",
    "EOS_ID",
    "MAX_BUILT_VOCAB",
    "cache_root",
    "corpus_text",
    "build_tokenizer",
    "load_tokenizer",
    "save_tokenizer",
    "has_tokenizer_files",
    "has_chat_template",
]

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN = "<|pad|>", "<|bos|>", "<|eos|>"
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
MAX_BUILT_VOCAB = 4096
_RECIPE = "bytelevel-bpe-v1"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def cache_root() -> Path:
    """``$INFERLOOM_CACHE`` or ``~/.cache/inferloom``."""
    env = os.environ.get("INFERLOOM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "inferloom"


def corpus_text() -> str:
    """The shipped training corpus (plain original prose, generated deterministically)."""
    return resources.files("inferloom").joinpath("data/corpus.txt").read_text(encoding="utf-8")


def _train(corpus: str, vocab_size: int) -> Any:
    """Train the byte-level BPE (a ``tokenizers.Tokenizer``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[PAD_TOKEN, BOS_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = [ln for ln in corpus.splitlines() if ln.strip()]
    tok.train_from_iterator(lines, trainer=trainer, length=len(lines))
    if tok.token_to_id(PAD_TOKEN) != PAD_ID or tok.token_to_id(BOS_TOKEN) != BOS_ID:
        raise RuntimeError("tokenizer recipe: special tokens did not get their fixed ids")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, BOS_ID)],
    )
    return tok


def _wrap(tok: Any) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        padding_side="left",
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )


def _fix_tokenizer_config(path: Path) -> None:
    """Name the plain ``PreTrainedTokenizerFast`` class so that any loader
    (older transformers, vLLM) can build it from ``tokenizer.json``."""
    cfg_path = path / "tokenizer_config.json"
    if not cfg_path.is_file():
        return
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg.setdefault("bos_token", BOS_TOKEN)
    cfg.setdefault("eos_token", EOS_TOKEN)
    cfg.setdefault("pad_token", PAD_TOKEN)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def build_tokenizer(model_vocab_size: int | None = None, cache_dir: str | Path | None = None) -> Any:
    """The locally built tokenizer for a synthetic preset.

    Vocabulary target: ``min(model_vocab_size, 4096)`` (the shipped corpus may
    saturate below the target: BPE stops when no pair repeats). Deterministic;
    cached on disk and loaded from the cache on later calls.
    """
    from transformers import PreTrainedTokenizerFast

    vocab = MAX_BUILT_VOCAB if model_vocab_size is None else min(int(model_vocab_size), MAX_BUILT_VOCAB)
    if vocab < 512:
        raise ValueError(f"model vocab size {model_vocab_size} too small for the built tokenizer (need >= 512)")
    corpus = corpus_text()
    digest = hashlib.sha256(f"{_RECIPE}\n{vocab}\n".encode() + corpus.encode()).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "tokenizers"
    target = root / digest
    if (target / "tokenizer.json").is_file():
        try:
            return PreTrainedTokenizerFast.from_pretrained(str(target), local_files_only=True, padding_side="left")
        except Exception:  # a corrupt cache entry: rebuild it
            shutil.rmtree(target, ignore_errors=True)
    tok = _wrap(_train(corpus, vocab))
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=root))
    try:
        tok.save_pretrained(str(tmp))
        _fix_tokenizer_config(tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process won the race; use its copy
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tok


def save_tokenizer(tok: Any, out_dir: str | Path) -> None:
    """Save a tokenizer so that AutoTokenizer / vLLM can load it from ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out))
    _fix_tokenizer_config(out)


def has_tokenizer_files(model_dir: str | Path) -> bool:
    p = Path(model_dir)
    return any((p / name).is_file() for name in _TOKENIZER_FILES[:3])


def has_chat_template(model_dir: str | Path) -> bool:
    """The directory's tokenizer has its own chat template (files only, nothing loaded): a
    ``chat_template.jinja`` (or ``chat_template.json``), or ``chat_template`` in ``tokenizer_config.json``.
    A preset's built BPE has none."""
    p = Path(model_dir)
    if (p / "chat_template.jinja").is_file() or (p / "chat_template.json").is_file():
        return True
    try:
        cfg = json.loads((p / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and bool(cfg.get("chat_template"))


def load_tokenizer(model: str, model_vocab_size: int | None = None) -> Any:
    """Tokenizer for a preset name or a local model directory.

    A directory with its own tokenizer files loads them (``AutoTokenizer``,
    ``local_files_only=True``); otherwise the locally built BPE is used.
    A pad token is always set (falling back to EOS, then BOS, for directories
    whose tokenizer has none); padding is on the left.
    """
    if model in PRESETS:
        vocab = model_vocab_size or PRESETS[model]["vocab_size"]
        return build_tokenizer(vocab)
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ValueError(f"model '{model}': not a preset and not a local directory")
    if not has_tokenizer_files(path):
        if model_vocab_size is None:
            cfg = json.loads((path / "config.json").read_text())
            model_vocab_size = cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size")
        return build_tokenizer(model_vocab_size)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        if tok.eos_token is not None:
            tok.pad_token = tok.eos_token
        elif tok.bos_token is not None:
            tok.pad_token = tok.bos_token
    return tok
