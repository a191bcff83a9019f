"""Expert priors for a vLLM server on a GPU, ranked from the roofline of the
workload's own shape and from where stock measured against it.

The cost model (:mod:`inferloom.measure.costs`) splits one decode step's bytes
into weights, KV cache and activations; on a GPU a decode step at moderate
batch is bandwidth-bound, so a lever that halves a share of the bytes gains
what Amdahl's law allows for that share (:func:`decode_shares`). What stock
measured below its ceiling (``1 - fraction``, from PRELUDE's roofline) is
overhead the kernels' bytes don't explain: launch gaps, scheduling, host work;
the overhead levers (async scheduling, full CUDA graphs) share in that.

:func:`server_priors` turns these into :class:`~inferloom.agents.priors.Prior`
records whose ``predicted_gain`` is that estimate and whose ``rank`` orders
them by it, best first: on the Llama-3.1-8B shape at c64 256/128 bf16 the
weights are ~83% of a decode step's bytes, so fp8 weights rank first (predicted
x1.71 on the floor; measured x1.36 over stock on an H200, FACTS.md
2026-11-30). Priors that name knobs a workload lacks (a transformers session)
are skipped by the orchestrator, as any prior. N-gram speculation is left to
the search: it drafts from repeats in the prompt, and random-token prompts
have none.
"""

from __future__ import annotations

from typing import Any, Mapping

from inferloom.agents.priors import DEFAULT_PRIORS, Prior
from inferloom.measure.costs import DTYPE_BYTES, mean_decode_context, step_costs
from inferloom.measure.roofline import amdahl_limit

__all__ = ["decode_shares", "server_priors", "default_table", "DEFAULT_OVERHEAD"]

_CUDA = frozenset({"cuda", "rocm"})
#: the share of stock's time assumed to be overhead when PRELUDE measured no roofline (a guess)
DEFAULT_OVERHEAD = 0.3


def decode_shares(workload: Mapping[str, Any]) -> dict[str, float] | None:
    """Shares of one decode step's bytes (``weights``, ``kv_cache``,
    ``activations``) for the workload's model, batch and lengths at its dtype;
    None when the model's shape can't be read."""
    try:
        nbytes = DTYPE_BYTES.get(str(workload.get("dtype")), 2)
        inl, outl = int(workload.get("input_len") or 128), int(workload.get("output_len") or 64)
        c = step_costs(str(workload["model"]), int(workload.get("concurrency") or 1), mean_decode_context(inl, outl),
                       nbytes, input_len=inl)
    except (KeyError, ValueError, OSError, TypeError):
        return None
    b = c["decode_step"]["bytes_breakdown"]
    total = sum(b.values())
    return {"weights": b["weights"] / total, "kv_cache": (b["kv_cache_read"] + b["kv_cache_write"]) / total,
            "activations": b["activations"] / total}


def _is_moe(workload: Mapping[str, Any]) -> bool:
    try:
        c = step_costs(str(workload["model"]), 1, 16, 2)
    except (KeyError, ValueError, OSError, TypeError):
        return False
    return bool(c["model"].get("num_experts"))


def server_priors(workload: Mapping[str, Any], stock_fraction: float | None = None,
                  kv_fp8: str = "fp8") -> list[Prior]:
    """The server GPU priors for ``workload``, ranked by predicted gain (see the module docstring);
    ``kv_fp8``: the engine's fp8 KV-cache value (vLLM ``fp8``, SGLang ``fp8_e4m3``). A prior whose knob or
    value an engine's space lacks (vLLM's ``FLASHINFER``, SGLang's ``fa3``) is skipped by the orchestrator."""
    shares = decode_shares(workload)
    if shares is None:
        return []
    over = DEFAULT_OVERHEAD if stock_fraction is None else min(0.9, max(0.0, 1.0 - float(stock_fraction)))
    frac_note = ("a guessed 30%" if stock_fraction is None else f"{over * 100:.0f}% (stock at "
                 f"{float(stock_fraction) * 100:.0f}% of its roofline ceiling)")
    w, kv = shares["weights"], shares["kv_cache"]
    cands = [
        ("fp8-weights", {"quantization": "fp8"}, amdahl_limit(w, 2.0) - 1.0,
         f"weights are {w * 100:.0f}% of a decode step's bytes; fp8 halves them (Amdahl: x{amdahl_limit(w, 2.0):.2f} "
         "on the floor; measured x1.36 over stock bf16 on an H200, FACTS.md); lowers precision: judged by "
         "quality.numerics over the A/A floor"),
        ("fp8-kv-cache", {"kv_cache_dtype": kv_fp8}, amdahl_limit(kv, 2.0) - 1.0,
         f"the KV cache is {kv * 100:.0f}% of a decode step's bytes; fp8 halves it (Amdahl: "
         f"x{amdahl_limit(kv, 2.0):.2f}); lowers precision: judged by quality.numerics"),
        ("async-scheduling", {"async_scheduling": True}, 0.5 * over,
         f"overhead outside the kernels' bytes is {frac_note}; overlapping scheduling with execution hides "
         "part of it (guess: half)"),
        ("full-cuda-graphs", {"cudagraph_mode": "FULL_AND_PIECEWISE"}, 0.3 * over,
         f"overhead is {frac_note}; whole decode steps as one CUDA graph remove launch gaps (guess: 30% of it)"),
        ("larger-prefill-chunks", {"max_num_batched_tokens": 16384}, 0.02,
         "fewer, larger prefill chunks at 64 x 256 prompt tokens (guess)"),
        ("flashinfer", {"attention_backend": "FLASHINFER"}, 0.02,
         "FlashInfer's decode attention; attention is a small share at 384-token context (guess)"),
        ("fa3-attention", {"attention_backend": "fa3"}, 0.02,
         "SGLang's FlashAttention-3 backend on Hopper; attention is a small share at 384-token context (guess)"),
    ]
    if _is_moe(workload):  # vLLM's knob moe_configs: the fused-MoE kernel's tiles tuned on the device
        cands.append(("tuned-moe-configs", {"moe_configs": "tuned"}, 0.1 * w,
                      f"weights are {w * 100:.0f}% of a decode step's bytes and the experts' share is read by vLLM's "
                      "fused-MoE Triton kernel, which runs a default config where the installed vLLM ships none "
                      "for the shape; tiles tuned on the device for the traffic's batch sizes (guess: 10% of that "
                      "share; the tuning pass runs once, docs/kernels.md)"))
        # the experts' other kernels: vLLM moe_backend / SGLang moe_runner_backend (the engine's knob; the other
        # engine's prior is skipped). vLLM puts FlashInfer behind Triton on Hopper on a comment's belief
        for name, knob in (("flashinfer-moe-experts", "moe_backend"), ("flashinfer-moe-runner", "moe_runner_backend")):
            cands.append((name, {knob: "flashinfer_cutlass"}, 0.03,
                          "the experts' GEMMs through FlashInfer's CUTLASS grouped GEMM instead of the engine's "
                          "default (Triton on Hopper, where vLLM's source ranks FlashInfer slower without a "
                          "measurement of this shape); a guess of +3%, measured like any change"))
    cands.sort(key=lambda c: -c[2])
    return [Prior(name, changes, round(gain, 4), why, _CUDA, rank=1.0 + i)
            for i, (name, changes, gain, why) in enumerate(cands)]


def default_table(knob_names: Any, workload: Mapping[str, Any], state: Mapping[str, Any]) -> Any:
    """The orchestrator's prior table when none is given: None (the defaults),
    or for a vLLM knob space (it has ``quantization``) the server priors ranked
    from the roofline and stock's measured fraction (``state["extra"]
    ["roofline_stock"]["fraction"]``), then the defaults."""
    if "quantization" not in knob_names:
        return None
    extra = state.get("extra")
    roof = extra.get("roofline_stock") if isinstance(extra, Mapping) else None
    frac = roof.get("fraction") if isinstance(roof, Mapping) else None
    ok = isinstance(frac, (int, float)) and not isinstance(frac, bool) and frac > 0
    kv = knob_names.get("kv_cache_dtype") if isinstance(knob_names, Mapping) else None
    kv_fp8 = "fp8_e4m3" if kv is not None and "fp8" not in (getattr(kv, "choices", None) or ("fp8",)) else "fp8"
    return (*server_priors(workload, float(frac) if ok else None, kv_fp8), *DEFAULT_PRIORS)
