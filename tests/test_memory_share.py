"""Each server's memory share (pure arithmetic with a device's numbers), where
each memory setting of a launch comes from (spec, the candidate's knob, the
derived share), and the probes that read free memory. The real launch with the
CPU KV knob is in test_vllm_real.py."""

import json

import pytest

from inferloom.spec import load_spec
from inferloom.workloads.memory_share import (
    GiB,
    MemoryShareError,
    cpu_memory,
    cpu_share,
    gpu_share,
    kv_bytes_per_token,
    weight_bytes,
)
from inferloom.workloads.vllm_launch import memory_args

H200_TOTAL = 143_771 * (1 << 20)  # nvidia-smi's memory.total on the H200 (MiB)
LLAMA_8B_BF16 = 16_060_522_496  # Llama-3.1-8B's bf16 safetensors


def test_two_8b_servers_fit_on_an_h200_with_equal_kv():
    s = gpu_share(free=139 * GiB, total=H200_TOTAL, weights=LLAMA_8B_BF16, servers=2)
    # both budgets fit in what is free, with room left for the CUDA contexts and the client
    assert 2 * s.per_server_bytes <= 139 * GiB * 0.9 + 1
    # vLLM refuses to start unless free >= utilization x total: true for the first and for the second
    first = s.gpu_memory_utilization * H200_TOTAL
    assert first <= 139 * GiB and first <= 139 * GiB - s.per_server_bytes
    assert 0.40 <= s.gpu_memory_utilization <= 0.46  # the H200's hand-found 0.42 was of this size
    # every server gets the same KV cache: its share less the weights and the activation reserve
    assert s.kv_cache_bytes == s.per_server_bytes - LLAMA_8B_BF16 - 4 * GiB
    assert 40 * GiB < s.kv_cache_bytes < 45 * GiB
    assert "--gpu-memory-utilization" not in s.summary()  # engine-neutral: each framework says its own flag
    from inferloom.workloads.vllm_servers import MemoryShareOnce

    assert MemoryShareOnce.said(None, s) == s.summary() + " (--gpu-memory-utilization 0.445)"  # type: ignore[arg-type]


def test_a_pair_that_does_not_fit_says_so():
    with pytest.raises(MemoryShareError, match="do not fit"):
        gpu_share(free=40 * GiB, total=80 * GiB, weights=LLAMA_8B_BF16, servers=2)
    with pytest.raises(MemoryShareError):
        gpu_share(free=0, total=80 * GiB, weights=1, servers=2)


def test_cpu_kv_space_is_whole_gib_at_least_one_and_no_more_than_the_workload_fills():
    # a 2-core CI machine: 8.14 of 9.46 GiB available, tiny weights -> 1 GiB each (as set by hand before)
    s = cpu_share(int(8.14 * GiB), int(9.46 * GiB), 9_000_000)
    assert s.kv_cache_space_gib == 1 and s.device == "cpu"
    big = cpu_share(200 * GiB, 256 * GiB, 2 * GiB)
    assert big.kv_cache_space_gib == int((200 * GiB * 0.9 / 2 - 2 * GiB - 3 * GiB) // GiB) == 85
    assert cpu_share(200 * GiB, 256 * GiB, 2 * GiB, kv_need=3 * GiB).kv_cache_space_gib == 6  # twice the need
    llama_tiny = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256}
    assert kv_bytes_per_token(llama_tiny, 2) == 2 * 4 * 2 * 64 * 2
    assert kv_bytes_per_token({"hidden_size": 8}) is None


def test_probes_read_meminfo_and_weights(tmp_path):
    mi = tmp_path / "meminfo"
    mi.write_text("MemTotal:       24684100 kB\nMemFree:  1 kB\nMemAvailable:   24042764 kB\n")
    assert cpu_memory(mi) == (24042764 * 1024, 24684100 * 1024, str(mi))
    (tmp_path / "bad").write_text("MemTotal: 1 kB\n")
    with pytest.raises(MemoryShareError, match="MemAvailable"):
        cpu_memory(tmp_path / "bad")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "m" / "b.safetensors").write_bytes(b"x" * 5)
    assert weight_bytes(tmp_path / "m") == 15 and weight_bytes(tmp_path / "nothing") == 0


def test_a_config_only_directory_counts_the_weights_its_server_makes(tmp_path):
    """Measured on the H200 (2026-12-05): OLMoE-1B-7B's config-only preset (``--load-format dummy``) counted
    0 bytes of weights, each server of the pair was given 58.9 GiB of KV cache beside the 12.89 GiB vLLM
    loaded ("Model loading took 12.89 GiB memory"), and the second server ran out of memory."""
    from inferloom.models.moe_preset_dir import moe_preset_dir

    olmoe = weight_bytes(moe_preset_dir("olmoe-1b-7b"))
    assert abs(olmoe / GiB - 12.89) < 0.05, olmoe / GiB
    share = gpu_share(139.8 * GiB, 139.8 * GiB, olmoe)  # the H200's free memory that day
    assert share.kv_cache_bytes + olmoe + 4 * GiB <= share.per_server_bytes  # weights and activations fit beside it
    d = tmp_path / "cfg"
    d.mkdir()
    (d / "config.json").write_text('{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, '
                                   '"num_attention_heads": 4, "vocab_size": 100, "torch_dtype": "float32"}')
    # 2 layers x (attention 4 x 64^2 + MLP 3 x 64 x 128 + norms 2 x 64) + final norm + embedding and head
    params = 2 * (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64 + 2 * 100 * 64
    assert weight_bytes(d) == 4 * params
    (d / "config.json").write_text("{not json")
    assert weight_bytes(d) == 0  # an unreadable config counts no weights, as a directory without one
    text = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "vocab_size": 100}
    (d / "config.json").write_text(json.dumps({"text_config": text, "torch_dtype": "float32"}))
    assert weight_bytes(d) == 4 * params  # a multimodal config: its text model's parameters
    for hostile in ({**text, "num_attention_heads": 0}, {**text, "num_hidden_layers": -5}, [1, 2],
                    {"text_config": 3}, {**text, "hidden_size": "x"}):
        (d / "config.json").write_text(json.dumps(hostile))
        assert weight_bytes(d) == 0, hostile  # no traceback, no negative weights: none counted


def _spec(device, **more):
    return load_spec(None, {"framework": "vllm", "model": "llama-tiny", "device": device, **more})


def test_a_spec_value_wins_then_the_candidates_knob_then_the_derived_share():
    cpu = cpu_share(8 * GiB, 9 * GiB, 0)
    args, env, decided = memory_args(_spec("cpu"), {"kv_cache_space_gib": 0}, cpu, None, "cpu")
    assert (args, env) == ([], {"VLLM_CPU_KVCACHE_SPACE": "1"}) and decided["VLLM_CPU_KVCACHE_SPACE"] == "derived: 1"
    _, env, decided = memory_args(_spec("cpu"), {"kv_cache_space_gib": 4}, cpu, None, "cpu")
    assert env == {} and decided["VLLM_CPU_KVCACHE_SPACE"].startswith("knob")  # to_launch passes the knob's 4
    _, env, decided = memory_args(_spec("cpu", **{"serving.env": {"VLLM_CPU_KVCACHE_SPACE": "2"}}), {}, cpu, None, "cpu")
    assert env == {} and decided["VLLM_CPU_KVCACHE_SPACE"] == "spec: 2"

    gpu = gpu_share(139 * GiB, H200_TOTAL, LLAMA_8B_BF16)
    flags = {"--gpu-memory-utilization", "--kv-cache-memory-bytes"}
    args, _, decided = memory_args(_spec("cpu"), {}, gpu, flags, "cuda")
    assert args == ["--gpu-memory-utilization", str(gpu.gpu_memory_utilization),
                    "--kv-cache-memory-bytes", str(gpu.kv_cache_bytes)]
    args, _, decided = memory_args(_spec("cpu"), {}, gpu, {"--gpu-memory-utilization"}, "cuda")
    assert args == ["--gpu-memory-utilization", str(gpu.gpu_memory_utilization)]  # an older server: no kv flag
    assert "lacks it" in decided["--kv-cache-memory-bytes"]
    args, _, decided = memory_args(_spec("cpu"), {"gpu_memory_utilization": "0.9"}, gpu, flags, "cuda")
    assert args == [] and all(v.startswith("knob") for v in decided.values())  # the candidate's own knob
    s = _spec("cpu", **{"serving.extra_args": ["--gpu-memory-utilization=0.42"]})
    args, _, decided = memory_args(s, {}, gpu, flags, "cuda")
    assert args == ["--kv-cache-memory-bytes", str(gpu.kv_cache_bytes)] and decided["--gpu-memory-utilization"] == "spec"


def test_the_adapter_derives_the_cpu_share_once_and_launches_with_it(tmp_path):
    from inferloom.workloads.vllm_adapter import VLLMAdapter
    from inferloom.workloads.vllm_flags import ServerFlags

    (tmp_path / "config.json").write_text('{"vocab_size": 10}')
    a = VLLMAdapter(_spec("cpu", model=str(tmp_path)), tmp_path)
    a.server_flags = lambda: ServerFlags(None, "unavailable", "?", error="no server here")
    argv, env, origin = a.launch_argv({"kv_cache_space_gib": 0}, 8000)
    share = a.memory_share()
    assert share is not None and share.source == "/proc/meminfo" and a.memory_share() is share
    assert env["VLLM_CPU_KVCACHE_SPACE"] == str(share.kv_cache_space_gib)
    assert origin["memory"]["VLLM_CPU_KVCACHE_SPACE"].startswith("derived")
    assert a.describe()["memory_share"]["derived"]["kv_cache_space_gib"] == share.kv_cache_space_gib


def test_the_ladders_kv_share_halves_the_derived_kv_cache_and_is_its_first_answer_to_an_oom_on_a_gpu():
    from inferloom.workloads.base import resolve_config
    from inferloom.workloads.vllm_knobs import KV_SHARE_KNOB, recovery_options, vllm_knobs

    share = gpu_share(139.8 * GiB, H200_TOTAL, 13 * GiB)
    flags = {"--gpu-memory-utilization", "--kv-cache-memory-bytes"}
    full, _, _ = memory_args(_spec("cuda"), {KV_SHARE_KNOB: "derived"}, share, flags, "cuda")
    half, _, decided = memory_args(_spec("cuda"), {KV_SHARE_KNOB: "0.5"}, share, flags, "cuda")
    kv = lambda args: int(args[args.index("--kv-cache-memory-bytes") + 1])  # noqa: E731
    assert kv(full) == share.kv_cache_bytes and kv(half) == share.kv_cache_bytes // 2
    assert half[half.index("--gpu-memory-utilization") + 1] == str(share.gpu_memory_utilization)  # same share
    assert "kv_cache_share 0.5" in decided["--kv-cache-memory-bytes"]
    knobs = [k for k in vllm_knobs(64) if "cuda" in k.applies_to]
    knob = next(k for k in knobs if k.name == KV_SHARE_KNOB)
    assert knob.phase == "ENABLEMENT"  # never searched: only the ladder sets it
    stock = resolve_config(knobs, {})
    assert recovery_options("oom", stock, "cuda", knobs, {})[0] == {KV_SHARE_KNOB: "0.5"}
    assert recovery_options("oom", {**stock, KV_SHARE_KNOB: "0.5"}, "cuda", knobs, {})[0] == {"max_num_seqs": 64}
    cpu_knobs = [k for k in vllm_knobs(64) if "cpu" in k.applies_to]
    assert all(KV_SHARE_KNOB not in o for o in recovery_options("oom", resolve_config(cpu_knobs, {}), "cpu", cpu_knobs, {}))
