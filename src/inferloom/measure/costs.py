"""The cost model: bytes moved and FLOPs of a decode step and of a prefill.

:func:`step_costs` counts bytes moved and FLOPs for one decode step and for
one prefill, from the model's shape (:func:`model_shape`; no weights
needed); :func:`mean_decode_context` (from :mod:`inferloom.models.decode_shapes`)
is the mean context of a ``generate()``'s decode steps. The roofline (:mod:`inferloom.measure.roofline`)
turns these counts into time floors.

Cost model (dense decoder, Llama / Mistral / Qwen shape: GQA attention, gated
MLP, untied or tied LM head). Notation: ``h`` hidden size, ``I`` intermediate
size, ``n_l`` layers, ``n_h`` attention heads, ``n_kv`` KV heads, ``d``
head dim (``h / n_h`` unless given), ``V`` vocabulary, ``b`` batch
(sequences per forward), ``c`` context length a decode step attends over
(tokens in the KV cache, the new one included), ``L`` prompt length, ``B``
bytes per weight / activation element, ``B_kv`` bytes per KV-cache element.

Parameters per layer::

    P_attn = h*(n_h*d) + 2*h*(n_kv*d) + (n_h*d)*h        (q, k, v, o projections)
    P_mlp  = 3*h*I                                       (gate, up, down)
    P_norm = 2*h
    P_mm   = n_l*(P_attn + P_mlp) + V*h                  (all matrix-product weights, LM head included)
    P      = n_l*(P_attn + P_mlp + P_norm) + h + V*h + (0 if tied else V*h)   (stored parameters)
    KV bytes per token  kv_tok = 2 * n_l * n_kv * d * B_kv

One decode step (``b`` sequences, one new token each, context ``c``)::

    weights     = B * (P_mm + n_l*P_norm + h) + B*b*h    (every matrix read once; the embedding
                                                          table is not read, only b rows of it)
    kv_read     = b * c * kv_tok                        (the real context, not a padded cache)
    kv_write    = b * kv_tok
    activations = B * b * (n_l * a_layer + h + V)        (each matrix product and attention reads its
                                                          input and writes its output once; norms,
                                                          residuals and activations assumed fused)
    a_layer     = [h + (n_h+2*n_kv)*d] + [2*n_h*d] + [n_h*d + h] + [h + 2*I] + [I + h]
                   qkv in/out           attn q/out   o_proj       gate_up      down
    FLOPs       = 2*b*P_mm + 4*b*n_l*n_h*d*c             (matrix products + QK^T and PV)

Prefill of ``L`` tokens for ``b`` sequences (one forward; the LM head only on
the last position, as ``generate()`` does)::

    weights     = B * (P_mm + n_l*P_norm + h) + B*b*L*h
    kv_read     = b * L * kv_tok                        (attention reads K and V once)
    kv_write    = b * L * kv_tok
    activations = B * b * (L * n_l * a_layer + h + V)
    FLOPs       = 2*b*L*n_l*(P_attn+P_mlp) + 2*b*h*V + 4*b*n_l*n_h*d * L*(L+1)/2   (causal)

MoE (``num_experts`` E, ``num_experts_per_tok`` k, ``moe_intermediate_size`` I_e): ``P_mlp`` is the
active ``k*3*h*I_e + h*E`` (router) per token, so ``P_mm`` and the FLOPs count active parameters; the
stored ``P`` has ``E*3*h*I_e + h*E`` per layer; a forward over ``t`` tokens reads the experts they were
routed to, ``E*(1-(1-k/E)^t)`` per layer expected under uniform routing (``t = b`` for a decode step,
``b*L`` for a prefill), the other experts' weights not at all.

One ``generate()`` of ``b`` sequences, ``L`` in / ``n`` out: the prefill
yields the first token, then ``n - 1`` decode steps whose contexts are
``L+1 .. L+n-1``; KV reads are linear in ``c``, so the steps together cost
``n - 1`` steps at the mean context ``L + n/2`` (:func:`mean_decode_context`).
"""

from __future__ import annotations

from typing import Any, Mapping

from inferloom.models.decode_shapes import mean_decode_context  # re-exported; the kernel backends use it too
from inferloom.models.presets import PRESETS

__all__ = [
    "model_shape",
    "step_costs",
    "mean_decode_context",
    "SHAPE_KEYS",
    "derived_counts",
    "experts_touched",
    "weights_read",
    "decode_step_costs",
    "prefill_costs",
    "DTYPE_BYTES",
]

#: bytes per element of a dtype's name (torch's, as a Hugging Face config's ``torch_dtype`` spells it)
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


SHAPE_KEYS = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "intermediate_size": ("intermediate_size", "ffn_dim", "n_inner"),
    "num_layers": ("num_hidden_layers", "num_layers", "n_layer"),
    "num_heads": ("num_attention_heads", "n_head", "num_heads"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "head_dim": ("head_dim",),
    "vocab_size": ("vocab_size",),
    "tie_word_embeddings": ("tie_word_embeddings",),
    "num_experts": ("num_experts", "num_local_experts", "n_routed_experts"),
    "num_experts_per_tok": ("num_experts_per_tok",),
    "moe_intermediate_size": ("moe_intermediate_size",),
}


def model_shape(model: Any) -> dict[str, Any]:
    """The shape a cost model needs, from a preset name, a ``PRESETS`` entry,
    a :func:`~inferloom.models.presets.model_info` dict, a Hugging Face config
    (object or dict; its text config for multimodal ones) or a built model."""
    if isinstance(model, str):
        if model in PRESETS:
            model = PRESETS[model]
        else:
            from transformers import AutoConfig

            model = AutoConfig.from_pretrained(model, local_files_only=True)
    cfg = getattr(model, "config", model)  # a built model
    if hasattr(cfg, "get_text_config"):
        cfg = cfg.get_text_config()

    def get(key: str) -> Any:
        for k in SHAPE_KEYS[key]:
            v = cfg.get(k) if isinstance(cfg, Mapping) else getattr(cfg, k, None)
            if v is not None:
                return v
        return None

    shape = {k: get(k) for k in SHAPE_KEYS}
    missing = [k for k in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "vocab_size")
               if shape[k] is None]
    if missing:
        raise ValueError(f"model shape: missing {', '.join(missing)}")
    for k in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "vocab_size"):
        shape[k] = int(shape[k])
    shape["num_kv_heads"] = int(shape["num_kv_heads"] or shape["num_heads"])
    shape["head_dim"] = int(shape["head_dim"] or shape["hidden_size"] // shape["num_heads"])
    shape["tie_word_embeddings"] = bool(shape["tie_word_embeddings"] or False)
    if shape["num_experts"] and int(shape["num_experts"]) > 1:  # MoE: every layer's MLP is E routed experts
        if not shape["num_experts_per_tok"]:
            raise ValueError("model shape: an MoE config (num_experts) without num_experts_per_tok")
        shape["num_experts"], shape["num_experts_per_tok"] = int(shape["num_experts"]), int(shape["num_experts_per_tok"])
        shape["moe_intermediate_size"] = int(shape["moe_intermediate_size"] or shape["intermediate_size"])
    else:
        shape["num_experts"] = shape["num_experts_per_tok"] = shape["moe_intermediate_size"] = None
    return shape


def experts_touched(shape: Mapping[str, Any], tokens: float) -> float:
    """Distinct experts per MoE layer that ``tokens`` routed tokens read, expected under uniform routing:
    ``E * (1 - (1 - k/E)^tokens)`` (k at one token, E as tokens grow); 0 for a dense model."""
    E, k = shape.get("num_experts"), shape.get("num_experts_per_tok")
    return float(E) * (1.0 - (1.0 - k / E) ** max(float(tokens), 0.0)) if E else 0.0


def weights_read(shape: Mapping[str, Any], der: Mapping[str, Any], tokens: float) -> float:
    """Weight bytes one forward over ``tokens`` tokens reads: all of them for a dense model; for an MoE
    model the experts no token was routed to are not read (:func:`experts_touched`)."""
    if not shape.get("num_experts"):
        return float(der["weights_read_bytes"])
    unread = shape["num_experts"] - experts_touched(shape, tokens)
    return float(der["weights_read_bytes"]) - shape["num_layers"] * unread * der["expert_bytes"]


def derived_counts(shape: Mapping[str, Any], dtype_bytes: float, kv_dtype_bytes: float) -> dict[str, Any]:
    h, inter, nl = shape["hidden_size"], shape["intermediate_size"], shape["num_layers"]
    nh, nkv, d, v = shape["num_heads"], shape["num_kv_heads"], shape["head_dim"], shape["vocab_size"]
    p_attn = h * (nh * d) + 2 * h * (nkv * d) + (nh * d) * h
    E = shape.get("num_experts") or 0
    if E:  # MoE: k of E experts (gate, up, down of moe_intermediate_size) per token, plus the router
        k, im = shape["num_experts_per_tok"], shape["moe_intermediate_size"]
        p_expert = 3 * h * im
        p_mlp, p_mlp_stored, inter = k * p_expert + h * E, E * p_expert + h * E, k * im
    else:
        p_expert, p_mlp = 0, 3 * h * inter
        p_mlp_stored = p_mlp
    p_norm = 2 * h
    p_mm = nl * (p_attn + p_mlp) + v * h  # per token: the active matrix-product weights (FLOPs)
    head = v * h + (0 if shape["tie_word_embeddings"] else v * h)
    params = nl * (p_attn + p_mlp_stored + p_norm) + h + head
    a_layer = (h + (nh + 2 * nkv) * d) + (2 * nh * d) + (nh * d + h) + (h + 2 * inter) + (inter + h)
    return {
        "params_attn_per_layer": p_attn,
        "params_mlp_per_layer": p_mlp,
        "params_mlp_stored_per_layer": p_mlp_stored,
        "params_norm_per_layer": p_norm,
        "matmul_params": p_mm,
        "parameters": params,
        "active_parameters": nl * (p_attn + p_mlp + p_norm) + h + head,
        "expert_bytes": p_expert * dtype_bytes,
        "weight_bytes": params * dtype_bytes,
        "weights_read_bytes": (nl * (p_attn + p_mlp_stored) + v * h + nl * p_norm + h) * dtype_bytes,
        "kv_bytes_per_token": 2 * nl * nkv * d * kv_dtype_bytes,
        "activation_elems_per_token_layer": a_layer,
        "attention_flops_per_token_per_ctx": 4 * nl * nh * d,
    }


def decode_step_costs(shape: Mapping[str, Any], der: Mapping[str, Any], b: int, c: float, B: float) -> dict[str, Any]:
    h, nl, v = shape["hidden_size"], shape["num_layers"], shape["vocab_size"]
    kv_tok = der["kv_bytes_per_token"]
    bytes_ = {
        "weights": weights_read(shape, der, b) + B * b * h,
        "kv_cache_read": b * c * kv_tok,
        "kv_cache_write": b * kv_tok,
        "activations": B * b * (nl * der["activation_elems_per_token_layer"] + h + v),
    }
    flops_ = {
        "matmul": 2.0 * b * der["matmul_params"],
        "attention": b * der["attention_flops_per_token_per_ctx"] * c,
    }
    return _phase(bytes_, flops_, tokens=b)


def prefill_costs(shape: Mapping[str, Any], der: Mapping[str, Any], b: int, L: int, B: float) -> dict[str, Any]:
    h, nl, v = shape["hidden_size"], shape["num_layers"], shape["vocab_size"]
    kv_tok = der["kv_bytes_per_token"]
    per_layer_mm = der["params_attn_per_layer"] + der["params_mlp_per_layer"]
    bytes_ = {
        "weights": weights_read(shape, der, b * L) + B * b * L * h,
        "kv_cache_read": b * L * kv_tok,
        "kv_cache_write": b * L * kv_tok,
        "activations": B * b * (L * nl * der["activation_elems_per_token_layer"] + h + v),
    }
    flops_ = {
        "matmul": 2.0 * b * L * nl * per_layer_mm + 2.0 * b * h * v,
        "attention": b * der["attention_flops_per_token_per_ctx"] * L * (L + 1) / 2.0,
    }
    return _phase(bytes_, flops_, tokens=b * L)


def _phase(bytes_: dict[str, float], flops_: dict[str, float], tokens: int) -> dict[str, Any]:
    tb = float(sum(bytes_.values()))
    tf = float(sum(flops_.values()))
    return {
        "tokens": int(tokens),
        "bytes": tb,
        "bytes_breakdown": {k: float(x) for k, x in bytes_.items()},
        "flops": tf,
        "flops_breakdown": {k: float(x) for k, x in flops_.items()},
        "arithmetic_intensity": tf / tb if tb > 0 else None,
    }


def step_costs(
    model_config_or_info: Any,
    batch: int,
    context_len: float,
    dtype_bytes: float,
    *,
    input_len: int | None = None,
    kv_dtype_bytes: float | None = None,
) -> dict[str, Any]:
    """Bytes moved and FLOPs of one decode step (``batch`` sequences attending
    over ``context_len`` cached tokens) and of the prefill of ``input_len``
    tokens per sequence (default ``context_len``), from the model's shape.

    ``model_config_or_info``: anything :func:`model_shape` accepts.
    ``dtype_bytes``: bytes per weight / activation element (a dtype name
    like "bfloat16" is accepted too); ``kv_dtype_bytes`` defaults to it.
    Formulas: see the module docstring. Returns ``model`` (shape and derived
    counts: parameters, weight_bytes, kv_bytes_per_token, ...), ``decode_step``
    and ``prefill`` (each ``bytes``, ``flops``, their breakdowns and the
    arithmetic intensity), and the inputs.
    """
    if isinstance(dtype_bytes, str):
        dtype_bytes = DTYPE_BYTES[dtype_bytes]
    if isinstance(kv_dtype_bytes, str):
        kv_dtype_bytes = DTYPE_BYTES[kv_dtype_bytes]
    B = float(dtype_bytes)
    Bkv = float(kv_dtype_bytes if kv_dtype_bytes is not None else dtype_bytes)
    if batch < 1 or context_len < 0 or B <= 0 or Bkv <= 0:
        raise ValueError("step_costs: batch >= 1, context_len >= 0 and positive byte sizes expected")
    shape = model_shape(model_config_or_info)
    der = derived_counts(shape, B, Bkv)
    L = int(input_len if input_len is not None else max(1, round(context_len)))
    return {
        "model": {**shape, **{k: (float(x) if isinstance(x, float) else int(x)) for k, x in der.items()}},
        "batch": int(batch),
        "context_len": float(context_len),
        "input_len": L,
        "dtype_bytes": B,
        "kv_dtype_bytes": Bkv,
        "decode_step": decode_step_costs(shape, der, int(batch), float(context_len), B),
        "prefill": prefill_costs(shape, der, int(batch), L, B),
        "formulas": "see inferloom.measure.costs module docstring",
    }

