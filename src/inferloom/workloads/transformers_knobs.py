"""The transformers engine's knob space and its applicability rules.

:func:`transformers_knobs` is the table of knobs (``dtype``,
``attn_implementation``, ``sdpa_backend``, ``cache_implementation``,
``compile_mode``, ``micro_batch``, ``cpu_threads``, ``tf32_matmul``,
``prompt_lookup``, ``decode_loop``; the KERNEL phase's ``rmsnorm_impl``,
``attention_kernel`` and ``mlp_kernel``, applied by
:mod:`inferloom.workloads.engine_kernels`); :func:`check_applicable` refuses
a resolved configuration whose knob does not apply to the device, or whose
values cannot work together there, with ``AdapterError(kind='unsupported')``
naming the knob.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Mapping

from inferloom.kernels.written_set import conflict as written_conflict
from inferloom.spec import WorkloadSpec
from inferloom.workloads.base import AdapterError, Knob
from inferloom.workloads.static_loop import LOOPS

__all__ = ["transformers_knobs", "check_applicable"]

_CUDA = frozenset({"cuda"})
_CPU = frozenset({"cpu"})
_SDPA_BACKENDS = ("auto", "math", "efficient", "flash", "cudnn")
_SDPA_CPU_OK = ("auto", "math", "flash")  # torch has a CPU flash-attention kernel
_COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")


def _flex_available() -> bool:
    if importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
        return False
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        return "flex_attention" in ALL_ATTENTION_FUNCTIONS
    except Exception:  # pragma: no cover
        return False


def _flash_attn_impls() -> list[str]:
    """Hugging Face flash-attention implementations whose package is installed (CUDA only)."""
    out: list[str] = []
    try:
        from transformers.utils import import_utils as iu
    except Exception:  # pragma: no cover
        return out
    for n in (2, 3):
        fn = getattr(iu, f"is_flash_attn_{n}_available", None)
        try:
            if fn is not None and fn():
                out.append(f"flash_attention_{n}")
        except Exception:  # pragma: no cover
            pass
    return out


def transformers_knobs(spec: WorkloadSpec, startup_threads: int) -> list[Knob]:
    """The engine's knobs for ``spec`` (``startup_threads``: torch's thread count when the engine was built)."""
    t = spec.traffic
    attn = ["eager", "sdpa"]
    if _flex_available():
        attn.append("flex_attention")
    attn.extend(_flash_attn_impls())
    ncpu = os.cpu_count() or 1
    return [
        Knob(
            "dtype", "choice", spec.dtype,
            "weight and activation dtype (float16 is slow on most CPUs)",
            choices=("float32", "bfloat16", "float16"), changes_numerics=True,
        ),
        Knob(
            "attn_implementation", "choice", "sdpa",
            "transformers attention implementation (flash_attention_* only on CUDA)",
            choices=tuple(attn), changes_numerics=True,
        ),
        Knob(
            "sdpa_backend", "choice", "auto",
            "torch SDPA kernel forced with sdpa_kernel() (needs attn_implementation=sdpa); "
            "efficient and cudnn are CUDA-only, flash also has a CPU kernel",
            choices=_SDPA_BACKENDS, changes_numerics=True,
        ),
        Knob(
            "cache_implementation", "choice", "dynamic",
            "KV cache: dynamic (grows) or static (preallocated, fixed shapes; attention then "
            "runs over the padded cache with a mask, a different reduction)",
            choices=("dynamic", "static"), changes_numerics=True,
        ),
        Knob(
            "compile_mode", "choice", "off",
            "torch.compile mode: through transformers' CompileConfig with a static cache, "
            "torch.compile(model.forward, dynamic=True) with a dynamic cache; "
            "reduce-overhead (CUDA graphs) is CUDA-only and needs the static cache; "
            "fused kernels round differently",
            choices=_COMPILE_MODES, changes_numerics=True,
        ),
        Knob(
            "micro_batch", "int", t.concurrency,
            "requests per generate() call; each batch of `concurrency` requests is split into "
            "micro-batches (GEMM shapes change, so CUDA kernels and rounding may too)",
            low=1, high=t.concurrency, changes_numerics=True,
        ),
        Knob(
            "cpu_threads", "int", startup_threads,
            "torch intra-op threads during a run (torch.set_num_threads)",
            low=1, high=max(ncpu, startup_threads), applies_to=_CPU,
        ),
        Knob(
            "tf32_matmul", "bool", False,
            "allow TF32 tensor cores for float32 matmuls (dtype=float32 only)",
            applies_to=_CUDA, changes_numerics=True,
        ),
        Knob(
            "prompt_lookup", "int", 0,
            "prompt-lookup speculative decoding: draft tokens per step, 0 = off "
            "(transformers assisted generation is batch-size-1 only: needs micro_batch=1 and the "
            "dynamic cache; verifying several tokens per forward changes GEMM shapes and rounding)",
            low=0, high=10, changes_numerics=True,
        ),
        Knob(
            "decode_loop", "choice", "generate",
            "the decoding loop: generate (transformers' generate(): host work and a device sync around "
            "every step) or static_loop (inferloom's greedy loop over a static cache: prefill once, then "
            "the decode step, compiled by compile_mode, with nothing read back until the batch ends; "
            "needs cache_implementation=static); see workloads/static_loop.py",
            choices=LOOPS, changes_numerics=True,
        ),
        Knob(
            "rmsnorm_impl", "choice", "eager",
            "RMSNorm kernel (KERNEL phase): eager (transformers' ops) or torch_fused "
            "(torch.nn.functional.rms_norm, one fused kernel); see workloads/engine_kernels.py",
            choices=("eager", "torch_fused"), changes_numerics=True, phase="KERNEL",
        ),
        Knob(
            "attention_kernel", "choice", "sdpa",
            "decode attention over the static cache (KERNEL phase): sdpa (transformers, whole padded "
            "cache), torch_sliced (SDPA over the cache up to the batch's longest valid end), "
            "triton_decode (split-KV kernel reading only each row's valid range, CUDA); "
            "see workloads/engine_attention.py",
            choices=("sdpa", "torch_sliced", "triton_decode"), changes_numerics=True, phase="KERNEL",
        ),
        Knob(
            "mlp_kernel", "choice", "eager",
            "MLP gate/up projection (KERNEL phase): eager (transformers: two GEMMs, SiLU, mul), "
            "torch_gate_up (one GEMM over the concatenated [2I, H] weight, then SiLU·mul), "
            "triton_gate_up_silu (Triton GEMM with a SiLU·mul epilogue, CUDA); the separate gate/up "
            "weights are released; see workloads/engine_gate_up.py",
            choices=("eager", "torch_gate_up", "triton_gate_up_silu"), changes_numerics=True, phase="KERNEL",
        ),
    ]


def check_applicable(knobs: list[Knob], cfg: Mapping[str, Any], device: str) -> None:
    """Refuse (``AdapterError(kind='unsupported')``) a resolved configuration
    that cannot run on ``device``."""
    dev = device
    for knob in knobs:
        if dev not in knob.applies_to and cfg[knob.name] != knob.default:
            raise AdapterError(
                f"knob '{knob.name}': applies only to {', '.join(sorted(knob.applies_to))}, "
                f"device is {dev}",
                kind="unsupported",
            )

    def refuse(name: str, why: str) -> None:
        raise AdapterError(f"knob '{name}': {why}", kind="unsupported")

    if dev == "cpu":
        if cfg["sdpa_backend"] not in _SDPA_CPU_OK:
            refuse("sdpa_backend", f"{cfg['sdpa_backend']} is CUDA-only; device is cpu")
        if cfg["attn_implementation"].startswith("flash_attention"):
            refuse("attn_implementation", f"{cfg['attn_implementation']} is CUDA-only; device is cpu")
        if cfg["compile_mode"] == "reduce-overhead":
            refuse("compile_mode", "reduce-overhead captures CUDA graphs; device is cpu")
    if cfg["attention_kernel"] != "sdpa" and cfg["attn_implementation"] != "sdpa":
        refuse("attention_kernel", f"{cfg['attention_kernel']} replaces the sdpa attention path; "
               f"attn_implementation is {cfg['attn_implementation']}")
    if cfg["attention_kernel"] == "triton_decode" and dev != "cuda":
        refuse("attention_kernel", f"triton_decode is a CUDA kernel; device is {dev}")
    why = written_conflict(str(cfg.get("llm_kernel", "none")), cfg)  # the knob it replaces, the path it needs
    if why:
        refuse("llm_kernel", why)
    if cfg["mlp_kernel"] == "triton_gate_up_silu" and dev != "cuda":
        refuse("mlp_kernel", f"triton_gate_up_silu is a CUDA kernel; device is {dev}")
    if cfg["attention_kernel"] == "torch_sliced" and cfg["compile_mode"] == "reduce-overhead":
        refuse("attention_kernel", "torch_sliced slices to a data-dependent length, which CUDA graphs "
               "(reduce-overhead) cannot capture")
    if cfg["decode_loop"] == "static_loop":
        if cfg["cache_implementation"] != "static":
            refuse("decode_loop", "static_loop decodes over a static KV cache; cache_implementation is "
                   f"{cfg['cache_implementation']}")
        if cfg["prompt_lookup"] > 0:
            refuse("decode_loop", "static_loop decodes one token per step; prompt_lookup needs generate()")
    if cfg["compile_mode"] == "reduce-overhead" and cfg["cache_implementation"] != "static":
        refuse(
            "compile_mode",
            "reduce-overhead (CUDA graphs) needs cache_implementation=static; a dynamic cache "
            "changes shape every decode step",
        )
    if cfg["sdpa_backend"] != "auto" and cfg["attn_implementation"] != "sdpa":
        refuse("sdpa_backend", f"only applies with attn_implementation=sdpa, got {cfg['attn_implementation']}")
    if cfg["tf32_matmul"] and cfg["dtype"] != "float32":
        refuse("tf32_matmul", f"only affects float32 matmuls, dtype is {cfg['dtype']}")
    if cfg["prompt_lookup"] > 0 and cfg["cache_implementation"] != "dynamic":
        refuse(
            "prompt_lookup",
            "needs cache_implementation=dynamic (a static cache is sized for max_new_tokens and "
            "overflows with draft tokens)",
        )
    if cfg["prompt_lookup"] > 0 and cfg["micro_batch"] != 1:
        refuse(
            "prompt_lookup",
            "transformers assisted generation supports batch size 1 only; needs micro_batch=1, "
            f"got micro_batch={cfg['micro_batch']}",
        )
