"""Text prompts for a vLLM server, without a server: the pool drawing rule (shared with the
transformers engine), the adapter's token ids (the model directory's own tokenizer), the
quality sets' tokenizer, and the bad inputs (one line each, exit 2, nothing written)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from _vllm_env import ROOT, tiny_model_dir

from inferloom.errors import InferloomError
from inferloom.spec import load_spec
from inferloom.workloads.prompts import PromptError, pool_state, pool_window, text_prompts, tokenize_texts

TEXTS = [f"Note {i}." if i % 3 == 0 else f"Text number {i}: " + " ".join(["the quick brown fox"] * (1 + i % 4))
         for i in range(40)]  # a third of them shorter than any input_len used here


def _jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def _spec(model, **more):
    return load_spec(None, {"framework": "vllm", "device": "cpu", "model": model, "serving.python": sys.executable,
                            "traffic.concurrency": 2, "traffic.input_len": 12, "traffic.output_len": 4,
                            "quality.eval_prompts": 3, "quality.heldout_prompts": 3, "quality.prompt_len": 8,
                            "quality.continuation_len": 4, **more})


def test_pool_window_consecutive_seeds_take_disjoint_windows_until_the_pool_is_used_up():
    n, pool = 5, 23
    runs = [pool_window(pool, 1000 + s, n) for s in range(4)]  # 20 of 23 texts: no repeat anywhere
    flat = [i for r in runs for i in r]
    assert len(set(flat)) == len(flat) == 20
    assert pool_window(pool, 1000, n) == runs[0]  # deterministic in the seed
    assert len(set(pool_window(pool, 7, pool))) == pool  # a run of the whole pool: each text once
    # the fifth run wraps around the ring: it repeats only texts of the first
    assert set(pool_window(pool, 1004, n)) - set(flat) and len(set(pool_window(pool, 1004, n)) & set(flat)) == 2
    assert pool_window(2, 0, 5) == [pool_window(2, 0, 2)[i % 2] for i in range(5)]  # more than the pool: cycles
    assert pool_state(pool, 1001, n) == {"pool_size": 23, "window_start": (1001 * 5) % 23, "disjoint_runs": 4}
    with pytest.raises(PromptError):
        pool_window(0, 1, 1)


def test_text_prompts_is_the_same_rule_and_a_text_that_tokenizes_to_nothing_is_one_line():
    class Tok:
        def __call__(self, text):
            return {"input_ids": [1] + [len(w) for w in text.split() if w != "SILENT"]}

    texts = [f"w{i} " * (i + 1) for i in range(10)]
    got = text_prompts(texts, Tok(), 4, 3, 4)
    assert got == [Tok()(texts[i])["input_ids"][:4] for i in pool_window(10, 3, 4)]

    class Empty:
        def __call__(self, text):
            return {"input_ids": [] if text == "SILENT" else [5]}

    with pytest.raises(PromptError, match=r"f\.jsonl': text 2 \('SILENT'\) tokenizes to no tokens"):
        tokenize_texts(["ok", "SILENT"], Empty(), "prompts file 'f.jsonl'")


def test_adapter_sends_the_tokenizers_ids_of_the_drawn_texts(model_dir, tmp_path):
    from transformers import AutoTokenizer

    from inferloom.workloads.vllm_adapter import VLLMAdapter

    path = _jsonl(tmp_path / "texts.jsonl", TEXTS)
    a = VLLMAdapter(_spec(model_dir, **{"traffic.prompts": path, "traffic.input_len": 24}))
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    ids = [tok(t)["input_ids"] for t in TEXTS]
    n = a.spec.requests_per_run
    seen = []
    for seed in (5000, 5001, 5002, 5003):
        ps, cache = a.run_prompts(seed)
        want = [ids[i][:24] for i in pool_window(len(TEXTS), seed, n)]
        assert ps == want and len(ps) == n == 10
        assert len({len(p) for p in ps}) > 1 and max(len(p) for p in ps) == 24  # shorter texts stay shorter
        assert cache["prompts"] == path and cache["pool_size"] == 40 and cache["disjoint_runs"] == 4
        seen += pool_window(len(TEXTS), seed, n)
    assert len(set(seen)) == 40  # four runs of a comparison: every text once
    # warm-ups are random ids, never a text a timed run sends
    warm = a.random_prompts(7, 4)
    assert all(len(p) == 24 for p in warm) and not any(p in [x[:24] for x in ids] for p in warm)
    # shared prefix: the declared random prefix, then the text's first tokens, at most input_len in all
    b = VLLMAdapter(_spec(model_dir, **{"traffic.prompts": path, "serving.prefix": "shared",
                                        "serving.shared_prefix_len": 5}))
    ps, cache = b.run_prompts(5000)
    prefix = b.random_prompts(b.spec.seed + 424_242, 1, 5)[0]
    assert all(p[:5] == prefix and p[5:] == ids[i][:7] for p, i in zip(ps, pool_window(40, 5000, 10)))
    assert cache["shared_prefix_len"] == 5


def test_quality_prompts_file_through_a_server_uses_the_model_directorys_tokenizer(model_dir, tmp_path):
    from transformers import AutoTokenizer

    from inferloom.measure.quality import quality_prompt_sets
    from inferloom.workloads.vllm_adapter import VLLMAdapter

    path = _jsonl(tmp_path / "q.jsonl", TEXTS[:12])
    a = VLLMAdapter(_spec(model_dir, **{"quality.prompts_file": path}))
    sets = quality_prompt_sets(a.spec, a)
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    pool = {tuple(tok(t)["input_ids"][:8]) for t in TEXTS[:12]}
    assert len(sets["eval"]) == 3 == len(sets["heldout"]) and all(tuple(p) in pool for s in sets.values() for p in s)
    assert not {tuple(p) for p in sets["eval"]} & {tuple(p) for p in sets["heldout"]}

    class NoTokenizer:
        name = "fake"
        tokenizer = None

    with pytest.raises(PromptError, match="no tokenizer to encode texts with"):
        quality_prompt_sets(a.spec, NoTokenizer())


def _without_tokenizer(model_dir, tmp_path):
    d = tmp_path / "no-tokenizer"
    shutil.copytree(model_dir, d)
    for f in d.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            f.unlink()
    return str(d)


def test_a_model_directory_without_a_tokenizer_is_one_line_naming_the_file(model_dir, tmp_path):
    from inferloom.workloads.vllm_adapter import VLLMAdapter
    from inferloom.workloads.vllm_texts import check_server_texts

    d = _without_tokenizer(model_dir, tmp_path)
    q = _jsonl(tmp_path / "q.jsonl", TEXTS[:4])
    spec = _spec(d, **{"quality.prompts_file": q})
    with pytest.raises(PromptError, match=r"no tokenizer\.json \(nor tokenizer\.model, vocab\.json\)") as info:
        check_server_texts(spec)
    assert isinstance(info.value, InferloomError) and info.value.exit_code == 2
    assert "\n" not in str(info.value) and "quality.prompts_file" in str(info.value)
    with pytest.raises(PromptError, match="tokenizer.json"):
        VLLMAdapter(spec)  # checked when the adapter is made: before any server starts
    check_server_texts(_spec(d))  # no texts: no tokenizer needed
    with pytest.raises(PromptError, match="at least 2 texts"):
        check_server_texts(_spec(model_dir, **{"quality.prompts_file": _jsonl(tmp_path / "one.jsonl", ["x y"])}))


def _bench(tmp_path, spec_lines):
    spec = tmp_path / "spec.yaml"
    spec.write_text("\n".join(spec_lines) + "\n")
    out = tmp_path / "out.json"
    res = subprocess.run([sys.executable, "-m", "inferloom.cli", "bench", str(spec), "--aa", "--out", str(out)],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    return res, out


@pytest.mark.parametrize("case", ["no-tokenizer", "empty-file", "missing-file"])
def test_bad_text_input_for_a_server_is_one_line_exit_2_nothing_written(model_dir, tmp_path, case):
    """Through `inferloom bench`: refused before any server starts (serving.module is a stand-in that
    imports: the refusal comes first)."""
    texts = _jsonl(tmp_path / "t.jsonl", TEXTS[:6])
    model = model_dir
    if case == "no-tokenizer":
        model = _without_tokenizer(model_dir, tmp_path)
    elif case == "empty-file":
        (tmp_path / "t.jsonl").write_text("\n\n")
    else:
        texts = str(tmp_path / "gone.jsonl")
    res, out = _bench(tmp_path, ["framework: vllm", "device: cpu", f"model: {model}", "serving:",
                                 f"  python: {sys.executable}", "  module: json", "traffic:",
                                 f"  prompts: {texts}", "  concurrency: 2", "  input_len: 8", "  output_len: 4"])
    assert res.returncode == 2, res.stderr[-2000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("inferloom bench: error:"), res.stderr[-2000:]
    assert {"no-tokenizer": "tokenizer.json", "empty-file": "no texts found", "missing-file": "gone.jsonl"}[case] \
        in lines[0]
    assert not out.exists() and "Traceback" not in res.stderr


def test_metrics_take_variable_input_lengths_and_count_the_servers_disagreements():
    from inferloom.loadgen.metrics import RequestRecord, summarize

    def rec(n_in, server_in, ok=True):
        return RequestRecord(start=0.0, prompt_len=n_in, success=ok, ttft=0.1 if ok else None,
                             chunk_times=[0.1, 0.2, 0.3] if ok else [], output_tokens=3 if ok else 0,
                             latency=0.3 if ok else None, server_prompt_tokens=server_in)

    s = summarize([rec(5, 5), rec(17, 17), rec(9, 9), rec(30, None, ok=False)], 1.0)
    assert s["input_lens"] == [5, 17, 9, 30] and s["total_input_tokens"] == 31  # completed requests only
    assert s["total_token_throughput"] == 31 + 9 and s["server_input_mismatches"] == 0
    assert summarize([rec(5, 6), rec(7, 7)], 1.0)["server_input_mismatches"] == 1
    assert summarize([rec(5, None)], 1.0)["server_input_mismatches"] is None


@pytest.mark.parametrize("case", ["no-tokenizer", "empty-file"])
def test_bad_text_input_for_a_server_session_leaves_no_session_directory(model_dir, tmp_path, case):
    """Through `inferloom optimize`: the adapter's text checks run before the session directory is made."""
    texts = _jsonl(tmp_path / "t.jsonl", TEXTS[:6])
    model = _without_tokenizer(model_dir, tmp_path) if case == "no-tokenizer" else model_dir
    if case == "empty-file":
        (tmp_path / "t.jsonl").write_text("\n\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text("\n".join(["framework: vllm", "device: cpu", f"model: {model}", "serving:",
                               f"  python: {sys.executable}", "  module: json", "traffic:", f"  prompts: {texts}",
                               "  concurrency: 2", "  input_len: 8", "  output_len: 4"]) + "\n")
    d = tmp_path / "session"
    res = subprocess.run([sys.executable, "-m", "inferloom.cli", "optimize", str(spec), "--out", str(d), "--no-kb",
                          "--quiet", "--budget-minutes", "1"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("inferloom optimize: error:"), res.stderr
    assert not d.exists() and "Traceback" not in res.stderr


def test_max_num_seqs_below_the_concurrency_is_refused_before_it_costs_a_trial(model_dir):
    """CrossKnobRules: at a closed-loop throughput objective, max_num_seqs under the concurrency is slower by
    construction (H200: max_num_seqs=1 at c64 measured -96.6%); the default orchestrator never proposes it."""
    from inferloom.workloads.base import CrossKnobRules
    from inferloom.workloads.vllm_adapter import VLLMAdapter

    a = VLLMAdapter(_spec(model_dir, **{"traffic.concurrency": 8}))
    assert isinstance(a, CrossKnobRules)
    why = a.config_refusal({"max_num_seqs": 1})
    assert why is not None and "max_num_seqs=1 is below traffic.concurrency=8" in why
    assert [a.config_refusal({"max_num_seqs": n}) for n in (0, 8, 16)] == [None, None, None]
    poisson = VLLMAdapter(_spec(model_dir, **{"traffic.concurrency": 8, "serving.arrival": "poisson",
                                              "serving.request_rate": 5.0}))
    assert poisson.config_refusal({"max_num_seqs": 1}) is None  # open-loop arrivals: measured, not presumed
