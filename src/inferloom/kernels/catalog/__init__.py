"""The catalog: Triton (and torch) kernels for the hot ops of a decoder LLM,
each with its float64 reference, the op pattern it replaces, declared
tolerances and a per-device tuning cache.

Entries (:func:`inferloom.kernels.catalog.index.entries`, in priority order):

* ``decode_attention``: flash-decoding over a static KV cache, only
  ``[start, len)`` of each row, GQA (``decode_attention.py``);
* ``add_rmsnorm``: fused residual add + RMSNorm, HF numerics (``rmsnorm.py``);
* ``gate_up_silu``: gate/up GEMM with a SiLU·mul epilogue; ``silu_mul`` on a
  concatenated GEMM output; ``qkv_proj``: one GEMM over fused QKV weights
  (``mlp.py``);
* ``fp8_linear``: e4m3 GEMM with row/channel scales, CUDA sm_90+ only (``fp8.py``).

Triton kernels run on CUDA, and on CPU under ``TRITON_INTERPRET=1`` (set it
before triton is first imported; float32/float16 only there: bfloat16 is
wrong in the interpreter). Importing this package needs neither triton nor
torch (:func:`triton_available`, :func:`workload_shapes`); the kernel modules
and :mod:`~inferloom.kernels.catalog.index` need triton: check
:func:`triton_available` first where it may be missing.
"""

from __future__ import annotations

import importlib.util

__all__ = ["triton_available", "workload_shapes"]


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def workload_shapes(model: dict, batch: int, context: int, cache_len: int) -> dict[str, dict[str, int]]:
    """Each entry's shape at a decode step of ``model`` (a preset dict of HF
    config fields): ``batch`` sequences, ``context`` tokens already in a
    static cache of ``cache_len`` slots."""
    hidden = int(model["hidden_size"])
    hq = int(model["num_attention_heads"])
    hkv = int(model.get("num_key_value_heads") or hq)  # absent in MHA configs
    d = int(model.get("head_dim") or hidden // hq)
    inter = int(model["intermediate_size"])
    return {
        "decode_attention": {"batch": batch, "q_heads": hq, "kv_heads": hkv, "head_dim": d,
                             "max_len": cache_len, "context": context},
        "add_rmsnorm": {"tokens": batch, "hidden": hidden},
        "gate_up_silu": {"tokens": batch, "hidden": hidden, "intermediate": inter},
        "silu_mul": {"tokens": batch, "intermediate": inter},
        "qkv_proj": {"tokens": batch, "hidden": hidden, "q_heads": hq, "kv_heads": hkv, "head_dim": d},
        "fp8_linear": {"tokens": batch, "in_features": hidden, "out_features": 2 * inter},
    }
