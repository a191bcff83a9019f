"""traffic.trace in the spec (vllm only; exclusive with text prompts, Poisson arrivals, a shared prefix;
relative to the spec file's folder) and a bad trace refused by `inferloom bench` with one line, exit 2,
nothing written, before any server starts; the adapter's per-run plan (window, lengths, fresh ids)."""

from __future__ import annotations

import json
import sys

import pytest

from inferloom.cli import main
from inferloom.spec import SpecError, load_spec


def _trace(path, n=12):
    path.write_text("".join(json.dumps({"arrival_s": 0.25 * i, "input_len": 3 + i % 7, "output_len": 2 + i % 5})
                            + "\n" for i in range(n)))
    return path


def _vllm(**more):
    return {"framework": "vllm", "model": "llama-tiny", "device": "cpu", "serving.python": sys.executable, **more}


def test_trace_fields_and_their_refusals(tmp_path):
    t = _trace(tmp_path / "t.jsonl")
    spec = load_spec(overrides=_vllm(**{"traffic.trace": str(t), "traffic.trace_speed": 2.0}))
    assert spec.traffic.trace == str(t) and spec.traffic.trace_speed == 2.0 and spec.traffic.trace_max_in_flight is None
    cases = [
        ({"framework": "transformers", "serving.python": None}, "traffic.trace needs a server framework"),
        ({"traffic.prompts": str(tmp_path / "p.jsonl")}, "leave traffic.prompts random"),
        ({"serving.arrival": "poisson", "serving.request_rate": 2.0}, "carries its own arrivals"),
        ({"serving.prefix": "shared", "serving.shared_prefix_len": 4}, "serving.prefix shared"),
        ({"traffic.trace": str(tmp_path / "none.jsonl")}, "trace file"),
        ({"traffic.trace": str(tmp_path / "t.txt")}, ".jsonl (or Azure .csv)"),
        ({"traffic.trace_speed": 0}, "trace_speed"),
    ]
    (tmp_path / "p.jsonl").write_text('{"text": "hi"}\n')
    (tmp_path / "t.txt").write_text("")
    for more, needle in cases:
        with pytest.raises(SpecError) as e:
            load_spec(overrides={**_vllm(**{"traffic.trace": str(t)}), **more})
        assert needle in str(e.value) and "\n" not in str(e.value), (more, str(e.value))
    # goodput with SLOs works with a trace
    g = load_spec(overrides=_vllm(**{"traffic.trace": str(t), "objective": "goodput", "serving.slo_ttft_ms": 200}))
    assert g.objective == "goodput"


def test_trace_path_is_relative_to_the_spec_folder(tmp_path, monkeypatch):
    folder = tmp_path / "specs"
    folder.mkdir()
    _trace(folder / "t.jsonl")
    (folder / "s.yaml").write_text(f"framework: vllm\nmodel: llama-tiny\nserving: {{python: {sys.executable}}}\n"
                                   "traffic: {trace: t.jsonl}\n")
    monkeypatch.chdir(tmp_path)
    assert load_spec("specs/s.yaml").traffic.trace == str(folder / "t.jsonl")


def test_bench_refuses_a_bad_trace_with_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    from _vllm_env import require_vllm

    py = require_vllm()  # bench's preflight imports the server module first
    t = tmp_path / "t.jsonl"
    t.write_text('{"arrival_s": 0, "input_len": 3, "output_len": 2}\n{"arrival_s": 1, "input_len": 3}\n')
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"framework: vllm\nmodel: llama-tiny\ndevice: cpu\nserving: {{python: {py}}}\n"
                    "traffic: {trace: t.jsonl}\n")
    monkeypatch.chdir(tmp_path)
    rc = main(["bench", str(spec), "--aa", "--out", str(tmp_path / "out.json")])
    # a clean cache first writes the preset's server directory (its progress bars on stderr, in the cache only)
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if not ln.startswith("Writing model shards")]
    assert rc == 2 and len(err) == 1, err
    assert err[0] == (f"inferloom bench: error: trace '{t}': line 2: \"output_len\" must be an integer, got None")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml", "t.jsonl"]  # nothing written


@pytest.mark.parametrize("rows, more, needle", [
    (['{"timestamp": 0, "input_length": 100, "output_length": 40}'], {"serving.max_model_len": 128},
     "line 1: 100 input + 40 output tokens exceed the model's context of 128"),
    (['{"timestamp": 0, "input_length": 4000, "output_length": 100}'], {},
     "exceed the model's context of 4096"),  # llama-tiny's max_position_embeddings
    (['{"arrival_s": 0, "input_len": 3, "output_len": 2}'] * 4, {"traffic.num_prompts": 5}, "a run of 5 requests"),
])
def test_the_adapter_refuses_a_bad_trace_before_anything_starts(tmp_path, rows, more, needle):
    from inferloom.loadgen.trace import TraceError
    from inferloom.workloads.vllm_adapter import VLLMAdapter

    t = tmp_path / "t.jsonl"
    t.write_text("\n".join(rows) + "\n")
    spec = load_spec(overrides=_vllm(**{"traffic.trace": str(t), **more}))
    with pytest.raises(TraceError) as e:
        VLLMAdapter(spec)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_the_adapters_plan_replays_the_window_with_fresh_ids(tmp_path):
    from inferloom.workloads.vllm_adapter import VLLMAdapter

    t = _trace(tmp_path / "t.jsonl", 12)
    spec = load_spec(overrides=_vllm(**{"traffic.trace": str(t), "traffic.num_prompts": 4}))
    ad = VLLMAdapter(spec)
    assert ad.config_refusal({"max_num_seqs": 1}) is None  # not closed-loop: the concurrency rule doesn't apply
    p1, p1b, p2 = ad._trace.plan(10), ad._trace.plan(10), ad._trace.plan(11)
    assert p1 == p1b  # both arms of a pair: the same prompts, lengths, arrivals
    # seed 10: window 10 mod 3 = 1 of the 3 windows of 4, the trace's requests 4..7
    assert p1.state["window_index"] == 1 and p1.state["window_start"] == 4 and p1.state["windows"] == 3
    assert [len(p) for p in p1.prompts] == [3 + i % 7 for i in range(4, 8)]
    assert p1.output_lens == [2 + i % 5 for i in range(4, 8)] and p1.arrivals == [0.0, 0.25, 0.5, 0.75]
    assert p2.state["window_index"] == 2 and p2.prompts != p1.prompts  # the next pair: the next window
    p4 = ad._trace.plan(13)  # the ring of windows wraps: window 1 again, with fresh token ids
    assert p4.output_lens == p1.output_lens and p4.arrivals == p1.arrivals and p4.prompts != p1.prompts
    assert [len(p) for p in p4.prompts] == [len(p) for p in p1.prompts]
    # the server's context holds the trace's longest request (9 + 6 tokens here, the traffic's 128 + 64 are longer)
    from inferloom.workloads.vllm_launch import max_model_len

    assert ad._trace.longest() == max(3 + i % 7 + 2 + i % 5 for i in range(12))
    assert max_model_len(spec, 1000) == 1024 and max_model_len(spec, ad._trace.longest()) == max_model_len(spec)
    ad.close()
