"""The trace loader (inferloom.loadgen.trace): the shapes it reads, its refusals (one line each), rebasing,
scaling, and the window rule (both arms of a pair replay one window; consecutive pairs, consecutive ones)."""

from __future__ import annotations

import hashlib
import json

import pytest

from inferloom.errors import EXIT_BAD_INPUT
from inferloom.loadgen.trace import TraceError, load_trace, model_context


def _write(tmp_path, rows, name="t.jsonl"):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


def test_mooncake_shape_rebased_sorted_and_extra_keys_ignored(tmp_path):
    p = _write(tmp_path, [{"timestamp": 5000, "input_length": 10, "output_length": 4, "hash_ids": [1, 2]},
                          {"timestamp": 7500, "input_length": 20, "output_length": 8, "hash_ids": []},
                          {"timestamp": 6000, "input_length": 30, "output_length": 2}])
    tr = load_trace(p)
    assert tr.shape == "mooncake" and len(tr) == 3
    assert [r.arrival_s for r in tr.requests] == [0.0, 1.0, 2.5]  # ms -> s, sorted, first at 0
    assert [r.input_len for r in tr.requests] == [10, 30, 20]
    assert [r.output_len for r in tr.requests] == [4, 2, 8]
    assert [r.line for r in tr.requests] == [1, 3, 2]
    assert tr.sha256 == hashlib.sha256(p.read_bytes()).hexdigest()


def test_own_shape_time_scale_and_texts(tmp_path):
    p = _write(tmp_path, [{"arrival_s": 10.0, "input_len": 5, "output_len": 3},
                          {"arrival_s": 12.0, "text": "hello there world", "output_len": 4}])
    tr = load_trace(p, time_scale=2.0, tokenize=lambda s: list(range(len(s.split()) + 1)))
    assert tr.shape == "inferloom" and tr.time_scale == 2.0
    assert [r.arrival_s for r in tr.requests] == [0.0, 1.0]  # 2 s apart, replayed twice as fast
    assert tr.requests[1].input_len == 4 and tr.requests[1].ids == (0, 1, 2, 3)
    assert tr.requests[0].ids is None


def test_azure_csv_shape(tmp_path):
    p = tmp_path / "azure.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:50.9951690,396,109\n")
    tr = load_trace(p)
    assert tr.shape == "azure"
    assert tr.requests[0].arrival_s == 0.0 and tr.requests[1].arrival_s == pytest.approx(4.314579, abs=1e-6)
    assert [(r.input_len, r.output_len) for r in tr.requests] == [(374, 44), (396, 109)]


@pytest.mark.parametrize("rows, needle", [
    ([], "no requests"),
    (["", "  "], "no requests"),
    ([{"timestamp": 0, "input_length": 1, "output_length": 1}, "{not json"], "line 2 is not valid JSON"),
    (["[1, 2]"], "line 1: expected a JSON object"),
    ([{"input_len": 3, "output_len": 3}], "line 1: no arrival time"),
    ([{"timestamp": -5, "input_length": 1, "output_length": 1}], "line 1: \"timestamp\" -5 is negative"),
    ([{"arrival_s": 1.0, "input_len": 2, "output_len": 2}, {"arrival_s": -0.5, "input_len": 2, "output_len": 2}],
     "line 2: \"arrival_s\" -0.5 is negative"),
    ([{"arrival_s": "soon", "input_len": 2, "output_len": 2}], "must be a finite number"),
    ([{"timestamp": 0, "input_length": 0, "output_length": 1}], "line 1: \"input_length\" 0 is below 1"),
    ([{"arrival_s": 0, "input_len": 3, "output_len": 0}], "line 1: \"output_len\" 0 is below 1"),
    ([{"arrival_s": 0, "input_len": 2.5, "output_len": 2}], "must be an integer"),
    ([{"arrival_s": 0, "input_len": 2, "output_len": 2}, {"timestamp": 1, "input_length": 2, "output_length": 2}],
     "line 2 is a mooncake line in a inferloom trace"),
    ([{"arrival_s": 0, "input_len": 2, "text": "x", "output_len": 2}], "not both"),
    ([{"arrival_s": 0, "text": "  ", "output_len": 2}], "non-empty string"),
])
def test_refusals_are_one_line_naming_the_line(tmp_path, rows, needle):
    p = _write(tmp_path, rows)
    with pytest.raises(TraceError) as e:
        load_trace(p, tokenize=lambda s: [1])
    msg = str(e.value)
    assert needle in msg and "\n" not in msg and str(p) in msg
    assert e.value.exit_code == EXIT_BAD_INPUT


def test_missing_file_over_context_and_text_without_tokenizer(tmp_path):
    with pytest.raises(TraceError, match="not found"):
        load_trace(tmp_path / "nope.jsonl")
    p = _write(tmp_path, [{"arrival_s": 0, "input_len": 100, "output_len": 20},
                          {"arrival_s": 1, "input_len": 100, "output_len": 29}])
    assert len(load_trace(p, max_context=129)) == 2
    with pytest.raises(TraceError, match="line 2: 100 input \\+ 29 output tokens exceed the model's context of 128"):
        load_trace(p, max_context=128)
    t = _write(tmp_path, [{"arrival_s": 0, "text": "abc", "output_len": 2}], "texts.jsonl")
    with pytest.raises(TraceError, match="no tokenizer"):
        load_trace(t)
    with pytest.raises(TraceError, match="tokenizes to no tokens"):
        load_trace(t, tokenize=lambda s: [])
    with pytest.raises(TraceError, match="time scale"):
        load_trace(p, time_scale=0)
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,3,4\n")
    with pytest.raises(TraceError, match="line 2: TIMESTAMP 'yesterday' is not a datetime"):
        load_trace(bad)


def test_model_context(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    assert model_context(tmp_path) == 2048
    assert model_context(tmp_path, 512) == 512
    assert model_context(tmp_path / "missing") is None


def test_windows_consecutive_disjoint_and_rebased(tmp_path):
    p = _write(tmp_path, [{"arrival_s": 0.5 * i + (0.2 if i % 3 else 0), "input_len": 1 + i, "output_len": 1 + i % 5}
                          for i in range(23)])
    tr = load_trace(p)
    assert tr.windows(5) == 4  # 23 // 5; the last 3 requests are never replayed
    seen = []
    for seed in range(100, 104):
        w = tr.window(seed, 5)
        assert w.windows == 4 and len(w.requests) == 5 and w.arrivals[0] == 0.0
        assert w.arrivals == sorted(w.arrivals)
        seen += [r.line for r in w.requests]
        assert tr.window(seed, 5) == w  # both arms of a pair (one seed): the same arrivals and lengths
    assert sorted(seen) == list(range(1, 21))  # 4 consecutive seeds: 4 disjoint windows
    assert tr.window(104, 5) == tr.window(100, 5)  # then the ring of windows wraps
    w = tr.window(101, 5)
    assert w.start == (101 % 4) * 5
    assert w.arrivals == pytest.approx([r.arrival_s - w.requests[0].arrival_s for r in w.requests])
    whole = tr.window(7, 23)
    assert whole.windows == 1 and len(whole.requests) == 23
    with pytest.raises(TraceError, match="a run of 24 requests"):
        tr.window(0, 24)
    st = tr.state(w)
    assert st["file"] == str(p) and st["sha256"] == tr.sha256 and st["window_start"] == w.start
    assert st["window_len"] == 5 and st["windows"] == 4 and st["time_scale"] == 1.0
