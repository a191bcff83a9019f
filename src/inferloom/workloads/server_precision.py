"""At which precision a server's configuration runs, from the knobs vLLM and SGLang share by name
(``dtype``, ``quantization``, ``kv_cache_dtype``): the roofline's bytes per element (frameworks.py's
``stack_precision`` target for both servers)."""

from __future__ import annotations

from typing import Any, Mapping

from inferloom.measure.costs import DTYPE_BYTES

__all__ = ["stack_precision"]

_BYTES = {**DTYPE_BYTES, "fp8": 1}  # the servers' knob value for 8-bit floats beside torch's dtype names


def stack_precision(cfg: Mapping[str, Any], model_dtype: str) -> dict[str, Any]:
    """At which precision a server configuration runs: weights (``fp8`` when
    quantized at load), KV cache and activations, each with its bytes per
    element (for the roofline: fp8 weights halve the weight bytes), and a label
    for reports, e.g. ``"fp8 weights, bfloat16 KV cache, bfloat16 activations"``."""
    dt = str(cfg.get("dtype", "auto"))
    act = model_dtype if dt == "auto" else dt
    weights = "fp8" if cfg.get("quantization") == "fp8" else act
    kv = str(cfg.get("kv_cache_dtype", "auto"))
    kv = act if kv == "auto" else ("fp8" if kv.startswith("fp8") else kv)
    return {"weights": weights, "kv_cache": kv, "activations": act,
            "weight_bytes": _BYTES.get(weights, 2), "kv_bytes": _BYTES.get(kv, 2), "activation_bytes": _BYTES.get(act, 2),
            "label": f"{weights} weights, {kv} KV cache, {act} activations"}
