"""The SGLang server knob space: each knob, where it applies, whether it can
change numerics, and the ``sglang.launch_server`` flag it becomes. A value
equal to the knob's ``default`` passes nothing: the stock server runs with
SGLang's own defaults.

This is the static table (issue 32's list); ``server_flags.filter_knobs``
cuts it down to the flags the installed server's ``--help`` lists, and a
choice knob in :data:`VERBATIM_CHOICES` to the ``{...}`` choices it lists
(an attention backend the build lacks is never proposed)."""

from __future__ import annotations

from typing import Any, Collection, Mapping, Sequence

from inferloom.workloads.base import Knob
from inferloom.workloads.server_precision import stack_precision  # noqa: F401  (re-exported)

__all__ = ["sglang_knobs", "to_launch", "VERBATIM_CHOICES", "ENV_FALLBACK", "PRECISION_KNOBS", "stack_precision",
           "recovery_options", "CUDA_ROCM", "MOE_RUNNER_KNOB"]

CUDA_ROCM = frozenset({"cuda", "rocm"})
ALL = frozenset({"cpu", "cuda", "rocm"})

#: knobs that lower the arithmetic precision (judged with ``quality.numerics``)
PRECISION_KNOBS = frozenset({"quantization", "kv_cache_dtype", "dtype"})
#: SGLang has no environment fallback for a missing flag
ENV_FALLBACK: dict[str, str] = {}
#: choice knob -> its flag, whose argument is the knob's value as is
VERBATIM_CHOICES = {"attention_backend": "--attention-backend", "kv_cache_dtype": "--kv-cache-dtype",
                    "schedule_policy": "--schedule-policy", "dtype": "--dtype", "quantization": "--quantization",
                    "moe_runner_backend": "--moe-runner-backend"}
#: the knob of the MoE layers' experts' kernels (MoE models only: the adapter drops it for a dense one)
MOE_RUNNER_KNOB = "moe_runner_backend"
#: the decode CUDA-graph batch cap: SGLang 0.5.17 renamed it, the old name stays a deprecated alias
GRAPH_BS_FLAGS = ("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs")


def sglang_knobs(concurrency: int) -> list[Knob]:
    """Every knob inferloom knows for SGLang (the static table), for ``concurrency``."""
    hi = max(256, 4 * concurrency)
    graphs = ("default", *sorted({str(concurrency), "128", "256", "512"}, key=int))
    return [
        Knob("attention_backend", "choice", "default",
             "--attention-backend: triton, flashinfer or fa3 (FlashAttention 3, Hopper); each kept only when the "
             "installed server's --help lists it",
             choices=("default", "triton", "flashinfer", "fa3"), applies_to=CUDA_ROCM, changes_numerics=True),
        Knob("mem_fraction_static", "choice", "default",
             "--mem-fraction-static: fraction of the free memory for weights and KV pool (default: each server's "
             "derived share, so both servers of a pair fit: sglang_launch.memory_args)",
             choices=("default", "0.8", "0.85", "0.9"), applies_to=CUDA_ROCM),
        Knob("chunked_prefill_size", "choice", "default", "--chunked-prefill-size: prefill chunk tokens (-1: off)",
             choices=("default", "-1", "2048", "4096", "8192", "16384"), applies_to=ALL, changes_numerics=True),
        Knob("max_running_requests", "int", 0, "--max-running-requests (0 = server default)",
             low=0, high=hi, applies_to=ALL, changes_numerics=True),
        Knob("cuda_graph_max_bs", "choice", "default",
             "--cuda-graph-max-bs-decode (--cuda-graph-max-bs before 0.5.17): largest decode batch captured as a "
             "CUDA graph", choices=graphs, applies_to=CUDA_ROCM, changes_numerics=True),
        Knob("enable_torch_compile", "bool", False, "--enable-torch-compile: torch.compile the model (slower start)",
             applies_to=ALL, changes_numerics=True),
        Knob("quantization", "choice", "default", "--quantization fp8: weights quantized to fp8 at load time",
             choices=("default", "fp8"), applies_to=CUDA_ROCM, changes_numerics=True),
        Knob("kv_cache_dtype", "choice", "auto", "--kv-cache-dtype", choices=("auto", "fp8_e4m3", "fp8_e5m2"),
             applies_to=CUDA_ROCM, changes_numerics=True),
        Knob("dtype", "choice", "auto", "--dtype of weights and activations (auto = the checkpoint's)",
             choices=("auto", "bfloat16", "float16", "float32"), applies_to=ALL, changes_numerics=True),
        Knob("schedule_policy", "choice", "default", "--schedule-policy (lpm: longest prefix match first, fcfs, ...)",
             choices=("default", "lpm", "fcfs", "random", "dfs-weight", "lof"), applies_to=ALL,
             changes_numerics=True),
        Knob("schedule_conservativeness", "choice", "default",
             "--schedule-conservativeness: lower admits more requests per step (retractions when the KV runs out)",
             choices=("default", "0.3", "0.5", "1.5"), applies_to=ALL, changes_numerics=True),
        Knob("enable_mixed_chunk", "bool", False, "--enable-mixed-chunk: prefill chunks and decodes in one batch",
             applies_to=ALL, changes_numerics=True),
        Knob("disable_overlap_schedule", "bool", False, "--disable-overlap-schedule: no CPU/GPU overlap scheduler",
             applies_to=ALL),
        Knob("prefix_caching", "choice", "default", "off: --disable-radix-cache (results record the prompt mode)",
             choices=("default", "off"), applies_to=ALL),
        Knob("ngram_speculative_tokens", "int", 0,
             "--speculative-algorithm NGRAM --speculative-num-draft-tokens k: n-gram speculative decoding, 0 = off "
             "(verification batches can flip near-ties: judged by the quality contract)",
             low=0, high=8, applies_to=CUDA_ROCM, changes_numerics=True),
        Knob(MOE_RUNNER_KNOB, "choice", "default",
             "--moe-runner-backend: the kernels of the MoE layers' experts (triton, triton_kernel, FlashInfer's "
             "cutlass / trtllm, AMD's aiter; each kept only when the installed server's --help lists it; one the "
             "GPU or the layer can't run fails at the server's start); MoE models only",
             choices=("default", "triton", "triton_kernel", "flashinfer_cutlass", "flashinfer_trtllm", "aiter"),
             applies_to=CUDA_ROCM, changes_numerics=True),
    ]


def to_launch(cfg: Mapping[str, Any], server_flags: Collection[str] | None = None,
              ) -> tuple[list[str], dict[str, str], dict[str, tuple[str, Any]]]:
    """(arguments, environment, origin): ``origin`` maps each flag to the (knob, value) it came from, so a
    rejected flag is traced to its knob. ``server_flags``: the installed server's flags where known (the
    decode graph cap's name)."""
    args: list[str] = []
    origin: dict[str, tuple[str, Any]] = {}

    def flag(name: str, knob: str, *value: str) -> None:
        args.extend([name, *value])
        origin[name] = (knob, cfg[knob])

    for knob, name in (("attention_backend", "--attention-backend"), ("mem_fraction_static", "--mem-fraction-static"),
                       ("chunked_prefill_size", "--chunked-prefill-size"), ("quantization", "--quantization"),
                       ("schedule_policy", "--schedule-policy"),
                       ("schedule_conservativeness", "--schedule-conservativeness"),
                       (MOE_RUNNER_KNOB, "--moe-runner-backend")):
        if cfg.get(knob, "default") != "default":
            flag(name, knob, str(cfg[knob]))
    if cfg.get("cuda_graph_max_bs", "default") != "default":
        name = GRAPH_BS_FLAGS[1] if server_flags is None or GRAPH_BS_FLAGS[0] not in server_flags else GRAPH_BS_FLAGS[0]
        flag(name, "cuda_graph_max_bs", str(cfg["cuda_graph_max_bs"]))
    for knob, name in (("kv_cache_dtype", "--kv-cache-dtype"), ("dtype", "--dtype")):
        if cfg.get(knob, "auto") != "auto":
            flag(name, knob, str(cfg[knob]))
    if int(cfg.get("max_running_requests") or 0):
        flag("--max-running-requests", "max_running_requests", str(int(cfg["max_running_requests"])))
    for knob in ("enable_torch_compile", "enable_mixed_chunk", "disable_overlap_schedule"):
        if cfg.get(knob):
            flag("--" + knob.replace("_", "-"), knob)
    if cfg.get("prefix_caching", "default") == "off":
        flag("--disable-radix-cache", "prefix_caching")
    k = int(cfg.get("ngram_speculative_tokens") or 0)
    if k:
        flag("--speculative-algorithm", "ngram_speculative_tokens", "NGRAM")
        flag("--speculative-num-draft-tokens", "ngram_speculative_tokens", str(k))
    return args, {}, origin


def recovery_options(kind: str, stock: Mapping[str, Any], device: str, knobs: Sequence[Knob],
                     rejected_flags: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Flag changes that address a failure kind, least invasive first (among the installed server's ``knobs``)."""
    opts: list[dict[str, Any]] = []
    if kind == "oom":
        if stock.get("cuda_graph_max_bs", "default") == "default":
            opts.append({"cuda_graph_max_bs": "128"})
        runs = int(stock.get("max_running_requests") or 0)
        opts.extend({"max_running_requests": m} for m in (64, 16) if not runs or m < runs)
    if kind in ("startup_timeout", "crash") and stock.get("enable_torch_compile"):
        opts.append({"enable_torch_compile": False})
    if kind == "missing_kernel":
        if stock.get("attention_backend", "default") != "default":
            opts.append({"attention_backend": "default"})
        opts.append({"attention_backend": "triton"})
    defaults = {x.name: x.default for x in knobs}
    if kind == "unsupported_flag":
        for info in rejected_flags.values():
            k = info.get("knob")
            if k in defaults:
                opts.append({k: defaults[k]})
    return [o for o in opts if set(o) <= set(defaults)]  # never a knob the installed server lacks
