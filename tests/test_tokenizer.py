"""The locally built byte-level BPE tokenizer: deterministic, cached, round-trips text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inferloom.models import tokenizer as tk

TEXTS = [
    "Hello world! The scheduler measures 12.5 ms per step.",
    "  leading spaces, tabs\tand\nnewlines\n",
    'def f(x):\n    return {"a": x * 2}  # comment',
    "Unicode: café, naïve, 日本語, emoji 🙂, snowman ☃",
    "",
]


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERLOOM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_special_tokens_and_vocab(cache):
    tok = tk.build_tokenizer(4096)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (tk.PAD_ID, tk.BOS_ID, tk.EOS_ID)
    assert 512 <= len(tok) <= 4096
    assert tok.padding_side == "left"
    ids = tok("hello there")["input_ids"]
    assert ids[0] == tk.BOS_ID and tk.EOS_ID not in ids


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(cache, text):
    tok = tk.build_tokenizer(4096)
    ids = tok(text)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_vocab_capped_by_model_vocab(cache):
    tok = tk.build_tokenizer(600)
    assert len(tok) <= 600
    assert all(i < 600 for i in tok(TEXTS[0] + TEXTS[3])["input_ids"])


def test_cached_on_disk_and_reloaded(cache):
    a = tk.build_tokenizer(4096)
    entries = list((cache / "tokenizers").iterdir())
    assert len(entries) == 1 and (entries[0] / "tokenizer.json").is_file()
    cfg = json.loads((entries[0] / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    b = tk.build_tokenizer(4096)  # from the cache
    assert a.get_vocab() == b.get_vocab()
    assert [a(t)["input_ids"] for t in TEXTS] == [b(t)["input_ids"] for t in TEXTS]


def test_deterministic_across_processes(tmp_path):
    """Two fresh processes (different hash seeds, different caches) train the same tokenizer."""
    code = "from inferloom.models.tokenizer import build_tokenizer; build_tokenizer(4096)"
    files = []
    for i, seed in enumerate(("1", "2")):
        env = dict(os.environ, INFERLOOM_CACHE=str(tmp_path / f"c{i}"), PYTHONHASHSEED=seed)
        subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
        (entry,) = list((tmp_path / f"c{i}" / "tokenizers").iterdir())
        files.append((entry.name, (entry / "tokenizer.json").read_bytes()))
    assert files[0] == files[1]


def test_load_tokenizer_preset_and_dirs(cache, tmp_path):
    tok = tk.load_tokenizer("llama-tiny")
    assert tok.bos_token_id == tk.BOS_ID
    # a model directory without tokenizer files gets the built one
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 1000}))
    assert not tk.has_tokenizer_files(bare)
    t2 = tk.load_tokenizer(str(bare))
    assert len(t2) <= 1000
    # a directory with its own tokenizer files loads them (AutoTokenizer, local only)
    own = tmp_path / "own"
    tk.save_tokenizer(tok, own)
    (own / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 4096}))
    assert tk.has_tokenizer_files(own)
    t3 = tk.load_tokenizer(str(own))
    assert t3.get_vocab() == tok.get_vocab()
    assert t3.pad_token_id == tk.PAD_ID and t3.padding_side == "left"
    with pytest.raises(ValueError, match="not a preset"):
        tk.load_tokenizer(str(tmp_path / "missing"))


def test_corpus_is_shipped():
    text = tk.corpus_text()
    assert 30_000 <= len(text.encode()) <= 60_000
    assert Path(tk.__file__).parent.parent.joinpath("data", "corpus.txt").is_file()
