"""The vLLM server knob space: each knob, where it applies, whether it can
change numerics, and how it becomes a command-line flag or an environment
variable. A value equal to the knob's ``default`` passes nothing: the stock
server runs with the server's own defaults.

This is the static table: ``vllm_flags.filter_knobs`` cuts it down to the
flags the installed server lists in its ``--help`` (the knobs below whose flag
a given vLLM lacks, e.g. ``--num-scheduler-steps`` on V1 servers or
``--performance-mode`` on older ones, are dropped there, each with why)."""

from __future__ import annotations

import json
from typing import Any, Collection, Mapping, Sequence

from inferloom.workloads.base import Knob
from inferloom.workloads.server_precision import stack_precision  # noqa: F401  (re-exported)
from inferloom.workloads.vllm_kernel_overlays import plugin_knob
from inferloom.workloads.vllm_moe_backend import moe_backend_knob
from inferloom.workloads.vllm_moe_knob import moe_knob

__all__ = ["vllm_knobs", "to_launch", "CPU", "CUDA_ROCM", "ENV_FALLBACK", "VERBATIM_CHOICES", "PRECISION_KNOBS",
           "stack_precision", "recovery_options", "KV_SHARE_KNOB"]

#: the enablement ladder's KV-share knob (vllm_launch.memory_args scales the derived --kv-cache-memory-bytes)
KV_SHARE_KNOB = "kv_cache_share"
CPU = frozenset({"cpu"})
CUDA_ROCM = frozenset({"cuda", "rocm"})
ALL = frozenset({"cpu", "cuda", "rocm"})
_TRI = ("default", "on", "off")

#: knobs that lower the arithmetic precision: a candidate changing one is judged
#: with the spec's ``quality.numerics`` tolerance (``measure.quality_floor``)
PRECISION_KNOBS = frozenset({"quantization", "kv_cache_dtype", "dtype"})
#: knob -> the environment variable that sets it when the server lacks its flag
#: (servers before ~0.12; vLLM >= 0.13 deprecated the variable and 0.26 ignores it
#: silently: vllm-project/vllm#50292, so a server whose help has the flag gets the flag)
ENV_FALLBACK = {"attention_backend": "VLLM_ATTENTION_BACKEND"}
#: choice knob -> its flag, whose argument is the knob's value as is (narrowed
#: to the ``{...}`` choices the server's help lists, where it lists them)
VERBATIM_CHOICES = {"dtype": "--dtype", "kv_cache_dtype": "--kv-cache-dtype", "performance_mode": "--performance-mode",
                    "moe_backend": "--moe-backend"}


def vllm_knobs(concurrency: int, kv_space_gib: int = 0) -> list[Knob]:
    """Every knob inferloom knows for vLLM (the static table), for ``concurrency``."""
    hi = max(256, 4 * concurrency)
    graphs = ("default", *sorted({str(concurrency), "128", "256", "512"}, key=int))
    return [
        Knob("max_num_seqs", "int", 0, "--max-num-seqs: sequences per engine step (0 = server default)",
             low=0, high=hi, applies_to=ALL, changes_numerics=True),
        Knob("max_num_batched_tokens", "int", 0, "--max-num-batched-tokens: tokens per engine step (0 = server default)",
             low=0, high=65536, applies_to=ALL, changes_numerics=True),
        Knob("chunked_prefill", "choice", "default", "--[no-]enable-chunked-prefill",
             choices=_TRI, applies_to=ALL, changes_numerics=True),
        Knob("prefix_caching", "choice", "default", "--[no-]enable-prefix-caching (results record the prompt mode)",
             choices=_TRI, applies_to=ALL),
        Knob("dtype", "choice", "auto", "--dtype of weights and activations (auto = the checkpoint's)",
             choices=("auto", "bfloat16", "float16", "float32"), applies_to=ALL, changes_numerics=True),
        Knob("quantization", "choice", "default",
             "--quantization fp8: weights quantized to fp8 at load time (default = the checkpoint's own)",
             choices=("default", "fp8"), applies_to=CUDA_ROCM, changes_numerics=True),
        Knob("kv_cache_dtype", "choice", "auto", "--kv-cache-dtype",
             choices=("auto", "fp8", "fp8_e4m3", "fp8_e5m2"), applies_to=ALL, changes_numerics=True),
        Knob("block_size", "int", 0, "--block-size of the paged KV cache (0 = server default)",
             low=0, high=256, applies_to=ALL, changes_numerics=True),
        Knob("kv_cache_space_gib", "int", kv_space_gib, "VLLM_CPU_KVCACHE_SPACE: GiB of KV cache on CPU (0 = each "
             "server's share of the free memory, so both servers of a pair fit: vllm_launch.memory_args)",
             low=0, high=64, applies_to=CPU),
        Knob("gpu_memory_utilization", "choice", "default", "--gpu-memory-utilization",
             choices=("default", "0.8", "0.9", "0.95"), applies_to=CUDA_ROCM),
        Knob(KV_SHARE_KNOB, "choice", "derived", "the KV cache (--kv-cache-memory-bytes) each server of a pair "
             "gets, as a fraction of the one derived from free device memory (vllm_launch.memory_args): the "
             "enablement ladder's answer to an out-of-memory start; never searched",
             choices=("derived", "0.5", "0.25"), applies_to=CUDA_ROCM, phase="ENABLEMENT"),
        Knob("enforce_eager", "bool", False, "--enforce-eager: no compilation / graphs (faster start, slower steps)",
             applies_to=ALL, changes_numerics=True),
        Knob("optimization_level", "choice", "default", "--optimization-level (0 = no compilation ... 3)",
             choices=("default", "0", "1", "2", "3"), applies_to=ALL, changes_numerics=True),
        Knob("max_cudagraph_capture_size", "choice", "default",
             "--max-cudagraph-capture-size: largest batch captured as a CUDA graph (capture sizes 1, 2, 4, 8, "
             "16, ... up to it; larger batches run without graphs)",
             choices=graphs, applies_to=CUDA_ROCM, changes_numerics=True),
        Knob("cudagraph_mode", "choice", "default",
             "--compilation-config {\"cudagraph_mode\": ...}: which steps replay as CUDA graphs (FULL_AND_PIECEWISE: "
             "whole decode steps as one graph; PIECEWISE: graphs between attention calls; NONE: eager launches); "
             "replaces a --compilation-config given in serving.extra_args",
             choices=("default", "FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "PIECEWISE", "NONE"), applies_to=CUDA_ROCM,
             changes_numerics=True),
        Knob("performance_mode", "choice", "default",
             "--performance-mode: balanced, interactivity (small batches) or throughput (larger CUDA graphs, "
             "more aggressive batching, throughput-oriented kernels)",
             choices=("default", "balanced", "interactivity", "throughput"), applies_to=CUDA_ROCM,
             changes_numerics=True),
        Knob("ngram_speculative_tokens", "int", 0,
             "n-gram (prompt lookup) speculative decoding: draft tokens per step, 0 = off (greedy verification keeps "
             "the target's argmax, but verifies k+1 tokens per sequence in one batch: batch-dependent kernels can "
             "flip near-ties, so it is judged by the quality contract like any batching change)",
             low=0, high=8, applies_to=ALL, changes_numerics=True),
        Knob("async_scheduling", "bool", False, "--async-scheduling: overlap scheduling with execution (False passes no flag: a "
             "server that decides by itself may run it anyway, which its log says: server_says)",
             applies_to=ALL),
        Knob("attention_backend", "choice", "default",
             "--attention-backend (a server whose --help lacks it gets the VLLM_ATTENTION_BACKEND variable): "
             "CPU_ATTN on cpu, the others on GPUs; a backend the platform lacks fails at launch (missing_kernel)",
             choices=("default", "CPU_ATTN", "FLEX_ATTENTION", "FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "ROCM_ATTN"),
             applies_to=ALL, changes_numerics=True),
        Knob("num_scheduler_steps", "int", 1,
             "--num-scheduler-steps: multi-step scheduling of vLLM's V0 engine (< 0.10); newer servers reject "
             "the flag, which is then learned and never proposed again",
             low=1, high=16, applies_to=ALL, changes_numerics=True),
        plugin_knob(),  # KERNEL phase: a register_oot replacement through a plugin overlay (no flag)
        moe_knob(),  # tuned fused-MoE configs through VLLM_TUNED_CONFIG_FOLDER (no flag; CUDA, MoE models)
        moe_backend_knob(),  # --moe-backend: the experts' kernels (CUDA/ROCm, MoE models)
    ]


def to_launch(cfg: Mapping[str, Any], server_flags: Collection[str] | None = None,
              ) -> tuple[list[str], dict[str, str], dict[str, tuple[str, Any]]]:
    """(arguments, environment, origin): ``origin`` maps each flag or variable
    to the (knob, value) it came from, so a rejected flag is traced to its knob.
    ``server_flags``: the installed server's flags where known; a knob in
    :data:`ENV_FALLBACK` whose flag it lacks is set through its variable."""
    args: list[str] = []
    env: dict[str, str] = {}
    origin: dict[str, tuple[str, Any]] = {}

    def flag(name: str, knob: str, *value: str) -> None:
        args.extend([name, *value])
        origin[name] = (knob, cfg[knob])

    for knob, name in (("max_num_seqs", "--max-num-seqs"), ("max_num_batched_tokens", "--max-num-batched-tokens"),
                       ("block_size", "--block-size")):
        if int(cfg.get(knob, 0)):
            flag(name, knob, str(int(cfg[knob])))
    for knob, stem in (("chunked_prefill", "enable-chunked-prefill"), ("prefix_caching", "enable-prefix-caching")):
        v = cfg.get(knob, "default")
        if v == "on":
            flag(f"--{stem}", knob)
        elif v == "off":
            flag(f"--no-{stem}", knob)
    for knob, name in (("dtype", "--dtype"), ("kv_cache_dtype", "--kv-cache-dtype")):
        if cfg.get(knob, "auto") != "auto":
            flag(name, knob, str(cfg[knob]))
    for knob, name in (("quantization", "--quantization"), ("max_cudagraph_capture_size", "--max-cudagraph-capture-size"),
                       ("performance_mode", "--performance-mode"), ("moe_backend", "--moe-backend")):
        if cfg.get(knob, "default") != "default":
            flag(name, knob, str(cfg[knob]))
    if cfg.get("gpu_memory_utilization", "default") != "default":
        flag("--gpu-memory-utilization", "gpu_memory_utilization", str(cfg["gpu_memory_utilization"]))
    if cfg.get("cudagraph_mode", "default") != "default":
        flag("--compilation-config", "cudagraph_mode", json.dumps({"cudagraph_mode": str(cfg["cudagraph_mode"])}))
    if cfg.get("enforce_eager"):
        flag("--enforce-eager", "enforce_eager")
    if cfg.get("optimization_level", "default") != "default":
        flag("--optimization-level", "optimization_level", str(cfg["optimization_level"]))
    if int(cfg.get("num_scheduler_steps", 1)) != 1:
        flag("--num-scheduler-steps", "num_scheduler_steps", str(int(cfg["num_scheduler_steps"])))
    k = int(cfg.get("ngram_speculative_tokens", 0))
    if k:
        flag("--speculative-config", "ngram_speculative_tokens",
             json.dumps({"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4}))
    if cfg.get("async_scheduling"):
        flag("--async-scheduling", "async_scheduling")
    if int(cfg.get("kv_cache_space_gib") or 0) > 0:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(int(cfg["kv_cache_space_gib"]))
        origin["VLLM_CPU_KVCACHE_SPACE"] = ("kv_cache_space_gib", cfg["kv_cache_space_gib"])
    if cfg.get("attention_backend", "default") != "default":
        if server_flags is None or "--attention-backend" in server_flags:
            flag("--attention-backend", "attention_backend", str(cfg["attention_backend"]))
        else:
            env["VLLM_ATTENTION_BACKEND"] = str(cfg["attention_backend"])
            origin["VLLM_ATTENTION_BACKEND"] = ("attention_backend", cfg["attention_backend"])
    return args, env, origin


def recovery_options(kind: str, stock: Mapping[str, Any], device: str, knobs: Sequence[Knob],
                     rejected_flags: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Flag or environment changes that address a failure kind, least invasive first (for ``device``, among
    the installed server's ``knobs``; ``rejected_flags``: flag -> {knob, ...} the server refused)."""
    opts: list[dict[str, Any]] = []
    if kind == "oom":
        if device == "cpu" and int(stock.get("kv_cache_space_gib", 1)) != 1:
            opts.append({"kv_cache_space_gib": 1})
        if device != "cpu" and stock.get(KV_SHARE_KNOB, "derived") == "derived":  # half the derived KV cache:
            opts.append({KV_SHARE_KNOB: "0.5"})  # tried first, it leaves the batch as the workload sets it
        seqs = int(stock.get("max_num_seqs") or 0)
        opts.extend({"max_num_seqs": m} for m in (64, 16) if not seqs or m < seqs)
    if kind in ("startup_timeout", "missing_kernel", "crash") and not stock.get("enforce_eager"):
        opts.append({"enforce_eager": True})
    if kind == "missing_kernel":
        if stock.get("attention_backend", "default") != "default":
            opts.append({"attention_backend": "default"})
        if stock.get("dtype") != "float32":
            opts.append({"dtype": "float32"})
    defaults = {x.name: x.default for x in knobs}
    if kind == "unsupported_flag":
        for info in rejected_flags.values():
            k = info.get("knob")
            if k in defaults:
                opts.append({k: defaults[k]})
    return [o for o in opts if set(o) <= set(defaults)]  # never a knob the installed server lacks
