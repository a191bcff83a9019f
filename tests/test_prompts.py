"""Prompt sources: seeded, distinct per seed, clear errors for bad JSONL."""

from __future__ import annotations

import json

import pytest

from inferloom.workloads.prompts import PromptError, load_jsonl_texts, random_prompts, text_prompts


def test_random_prompts_seeded_and_shaped():
    a = random_prompts(7, n=5, length=12, vocab_size=300, avoid_ids=[0, 1, 2])
    b = random_prompts(7, n=5, length=12, vocab_size=300, avoid_ids=[0, 1, 2])
    assert a == b
    assert len(a) == 5 and all(len(p) == 12 for p in a)
    assert all(isinstance(t, int) for p in a for t in p)
    assert all(3 <= t < 300 for p in a for t in p)


def test_random_prompts_distinct_seeds_differ():
    a = random_prompts(1, n=4, length=16, vocab_size=1000)
    b = random_prompts(2, n=4, length=16, vocab_size=1000)
    assert a != b
    assert a[0] != a[1]  # prompts within one run differ too


def test_random_prompts_avoid_ids_never_drawn():
    avoid = set(range(0, 50))
    ps = random_prompts(3, n=20, length=50, vocab_size=60, avoid_ids=avoid)
    assert not avoid & {t for p in ps for t in p}
    with pytest.raises(ValueError, match="no token ids left"):
        random_prompts(3, n=1, length=1, vocab_size=3, avoid_ids=[0, 1, 2])


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_load_jsonl_texts_ok(tmp_path):
    p = _write(tmp_path / "p.jsonl", [json.dumps({"text": "alpha"}), "", json.dumps({"text": "beta", "id": 2})])
    assert load_jsonl_texts(p) == ["alpha", "beta"]


def test_load_jsonl_missing_file(tmp_path):
    with pytest.raises(PromptError, match="not found"):
        load_jsonl_texts(tmp_path / "nope.jsonl")


def test_load_jsonl_bad_json_names_line(tmp_path):
    p = _write(tmp_path / "p.jsonl", [json.dumps({"text": "ok"}), "{not json"])
    with pytest.raises(PromptError, match=r"line 2 is not valid JSON"):
        load_jsonl_texts(p)


def test_load_jsonl_missing_text_key_names_line(tmp_path):
    p = _write(tmp_path / "p.jsonl", [json.dumps({"text": "ok"}), json.dumps({"t": "x"})])
    with pytest.raises(PromptError, match=r'line 2 has no "text" key'):
        load_jsonl_texts(p)
    p2 = _write(tmp_path / "q.jsonl", [json.dumps(["text"])])
    with pytest.raises(PromptError, match="line 1"):
        load_jsonl_texts(p2)
    p3 = _write(tmp_path / "r.jsonl", [json.dumps({"text": 5})])
    with pytest.raises(PromptError, match="non-empty string"):
        load_jsonl_texts(p3)


def test_load_jsonl_empty_file(tmp_path):
    p = tmp_path / "e.jsonl"
    p.write_text("\n\n")
    with pytest.raises(PromptError, match="no texts"):
        load_jsonl_texts(p)


class _WordTok:
    """A stand-in tokenizer: one id per word, BOS=1 first."""

    def __call__(self, text):
        return {"input_ids": [1] + [10 + len(w) for w in text.split()]}


def test_text_prompts_seeded_truncated():
    texts = [" ".join(["w" * (i % 7 + 1)] * (i + 3)) for i in range(20)]
    tok = _WordTok()
    a = text_prompts(texts, tok, length=8, seed=5, n=6)
    assert a == text_prompts(texts, tok, length=8, seed=5, n=6)
    assert a != text_prompts(texts, tok, length=8, seed=6, n=6)
    assert len(a) == 6 and all(1 <= len(p) <= 8 and p[0] == 1 for p in a)
    # more prompts than texts: sampled with replacement
    assert len(text_prompts(texts[:2], tok, length=4, seed=0, n=5)) == 5
