"""The vLLM knob space and its mapping to server flags (no server needed)."""

import json

from inferloom.phases.allowlist import validate_proposal
from inferloom.spec import load_spec
from inferloom.workloads.base import resolve_config
from inferloom.workloads.vllm_adapter import VLLMAdapter
from inferloom.workloads.vllm_knobs import to_launch, vllm_knobs


def test_stock_passes_no_flag_and_each_knob_declares_platforms():
    knobs = vllm_knobs(8)
    stock = resolve_config(knobs, {})
    args, env, _ = to_launch(stock)
    assert args == [] and env == {}  # kv_cache_space_gib 0: the derived share is added at launch (memory_args)
    assert to_launch({**stock, "kv_cache_space_gib": 3})[1] == {"VLLM_CPU_KVCACHE_SPACE": "3"}
    names = {k.name for k in knobs}
    assert {"max_num_seqs", "max_num_batched_tokens", "chunked_prefill", "prefix_caching", "dtype", "kv_cache_dtype",
            "block_size", "kv_cache_space_gib", "gpu_memory_utilization", "enforce_eager", "optimization_level",
            "ngram_speculative_tokens", "async_scheduling", "attention_backend", "quantization",
            "max_cudagraph_capture_size", "performance_mode"} <= names
    by = {k.name: k for k in knobs}
    assert by["kv_cache_space_gib"].applies_to == {"cpu"} and "cpu" not in by["gpu_memory_utilization"].applies_to
    assert by["dtype"].changes_numerics and not by["prefix_caching"].changes_numerics
    for gpu_only in ("quantization", "max_cudagraph_capture_size", "performance_mode"):
        assert by[gpu_only].applies_to == {"cuda", "rocm"} and by[gpu_only].changes_numerics


def test_knob_values_become_flags_traced_to_their_knob():
    cfg = resolve_config(vllm_knobs(8), {"max_num_seqs": 16, "chunked_prefill": "off", "enforce_eager": True,
                                         "ngram_speculative_tokens": 3, "attention_backend": "CPU_ATTN"})
    args, env, origin = to_launch(cfg)
    assert args[args.index("--max-num-seqs") + 1] == "16"
    assert "--no-enable-chunked-prefill" in args and "--enforce-eager" in args
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    assert origin["--max-num-seqs"] == ("max_num_seqs", 16)
    assert origin["--attention-backend"] == ("attention_backend", "CPU_ATTN")


def test_a_flag_learned_as_rejected_is_refused_before_launch_and_in_proposals(tmp_path):
    spec = load_spec(None, {"framework": "vllm", "device": "cpu", "serving.python": "/nonexistent/python"})
    a = VLLMAdapter(spec, tmp_path)
    a.restore_rejected_flags({"--num-scheduler-steps": {"knob": "num_scheduler_steps", "value": 4,
                                                        "error": "unrecognized arguments", "whole_flag": False}})
    import pytest

    from inferloom.workloads.base import AdapterError

    with pytest.raises(AdapterError) as ei:
        a.prepare({"num_scheduler_steps": 4})
    assert ei.value.kind == "unsupported_flag" and "not launched again" in str(ei.value)
    knobs = a.knob_space()
    stock = resolve_config(knobs, {})
    state = {"device": "cpu", "stack": stock, "pinned": {}, "measured_config_keys": [],
             "extra": {"rejected_flags": a.rejected_flags}}
    _, rule, why = validate_proposal({"action": "try_config", "changes": {"num_scheduler_steps": 4}}, "FRAMEWORK",
                                     state, knobs)
    assert rule == "rejected_by_server" and "--num-scheduler-steps" in why
    ok, rule, _ = validate_proposal({"action": "try_config", "changes": {"max_num_seqs": 8}}, "FRAMEWORK", state, knobs)
    assert rule is None


def test_launch_failure_of_a_missing_server_python_is_an_adapter_error(tmp_path):
    import pytest

    from inferloom.workloads.base import AdapterError

    spec = load_spec(None, {"framework": "vllm", "device": "cpu", "serving.python": str(tmp_path / "no-python")})
    a = VLLMAdapter(spec, tmp_path)
    with pytest.raises(AdapterError) as ei:
        a.prepare({})
    assert ei.value.kind == "crash" and "could not execute" in str(ei.value)


def test_run_prompts_are_fresh_per_run_and_a_shared_prefix_is_declared(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"vocab_size": 500}))
    base = {"framework": "vllm", "device": "cpu", "model": str(tmp_path / "m"), "traffic.concurrency": 3,
            "traffic.input_len": 12}
    fresh = VLLMAdapter(load_spec(None, base), tmp_path)
    p1, c1 = fresh.run_prompts(1)
    p2, _ = fresh.run_prompts(2)
    assert len(p1) == 15 and all(len(p) == 12 for p in p1)  # default 5 x concurrency
    assert p1 != p2 and p1 == fresh.run_prompts(1)[0]
    assert c1["prompt_mode"] == "fresh" and c1["shared_prefix_len"] == 0
    shared = VLLMAdapter(load_spec(None, {**base, "serving.prefix": "shared", "serving.shared_prefix_len": 5}), tmp_path)
    s1, c = shared.run_prompts(1)
    s2, _ = shared.run_prompts(2)
    assert c["prompt_mode"] == "shared" and c["shared_prefix_len"] == 5
    assert len({tuple(p[:5]) for p in s1 + s2}) == 1  # one prefix, every prompt, every run
    assert len({tuple(p[5:]) for p in s1 + s2}) == 30  # the rest fresh
