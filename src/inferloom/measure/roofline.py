"""Roofline: how far a workload sits from what the device can do.

Three pieces, each a plain function returning a JSON-able dict:

* :func:`measure_ceilings` measures the device's two ceilings: memory
  bandwidth (a large copy, bytes read + written) and matmul rate (a large
  square matmul in the workload dtype). Medians over timed repetitions after
  a warm-up. Measure once per device and cache (the dict carries its date).
* :func:`step_costs` counts bytes moved and FLOPs for one decode step and for
  one prefill, from the model's shape (no weights needed).
* :func:`roofline` turns ceilings + costs + a measured throughput into time
  floors, the achievable output tok/s, the achieved fraction and the headroom;
  :func:`amdahl_check` flags a measured gain larger than the roofline or
  Amdahl's law allows.

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

One ``generate()`` of ``b`` sequences, ``L`` in / ``n`` out: the prefill
yields the first token, then ``n - 1`` decode steps whose contexts are
``L+1 .. L+n-1``; KV reads are linear in ``c``, so the steps together cost
``n - 1`` steps at the mean context ``L + n/2`` (:func:`mean_decode_context`).

Floors: a phase cannot take less than ``max(bytes / bandwidth, FLOPs / matmul
rate)`` (the roofline). The run floor is ``prefill_floor + (n-1) *
decode_step_floor``; the achievable ceiling is ``b * n / run_floor`` output
tok/s. Against FACTS.md (Llama-3.1-8B shape, bf16, batch 64, 256 in / 128 out,
4.11 TB/s): decode-step floor 4.38 ms (FACTS: 4.6 ms, which counts the whole
16.06 GB of weights, embedding table included; a step does not read the table)
and decode-only ceiling 15.3k tok/s at 4.3 TB/s (FACTS: 14,681).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import statistics
import time
from typing import Any, Callable, Mapping

__all__ = [
    "measure_ceilings",
    "model_shape",
    "step_costs",
    "mean_decode_context",
    "roofline",
    "amdahl_limit",
    "amdahl_check",
]

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


# ---------------------------------------------------------------- ceilings
def _cpu_name() -> str:
    from inferloom.provenance import cpu_model

    return cpu_model()


def _time_median(fn: Callable[[], None], sync: Callable[[], None], warmup: int, runs: int,
                 budget_s: float | None = None) -> list[float]:
    """Per-call seconds of ``fn`` (host clock around ``fn`` + ``sync``),
    after ``warmup`` untimed calls; stops early once ``budget_s`` is spent
    (at least 3 samples)."""
    for _ in range(warmup):
        fn()
    sync()
    samples: list[float] = []
    spent = 0.0
    for i in range(runs):
        t0 = time.perf_counter()
        fn()
        sync()
        dt = time.perf_counter() - t0
        samples.append(dt)
        spent += dt
        if budget_s is not None and i >= 2 and spent > budget_s:
            break
    return samples


def _cuda_time(fn: Callable[[], None], warmup: int, runs: int, inner: int = 1) -> list[float]:
    """Per-call seconds of ``fn`` from CUDA events (``inner`` calls per sample)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples: list[float] = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / inner)
    return samples


def _measure(dev: Any, on_cuda: bool, nbytes: int, tdtype: Any, matmul_n: int | None) -> tuple:
    """(bandwidth, copy samples, median copy s, n, flop rate, matmul samples, median matmul s)."""
    import torch

    def sync() -> None:
        if on_cuda:
            torch.cuda.synchronize(dev)

    # -- bandwidth
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    src.fill_(1)
    dst = torch.empty_like(src)
    copy = lambda: dst.copy_(src)  # noqa: E731
    if on_cuda:
        bw_samples = _cuda_time(copy, warmup=3, runs=10)
    else:
        bw_samples = _time_median(copy, sync, warmup=2, runs=8, budget_s=1.5)
    bw_s = statistics.median(bw_samples)
    bandwidth = 2.0 * nbytes / bw_s
    del src, dst

    # -- matmul
    n = int(matmul_n or (8192 if on_cuda else 1024))
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    a = torch.randn(n, n, device=dev, generator=gen, dtype=torch.float32).to(tdtype)
    b = torch.randn(n, n, device=dev, generator=gen, dtype=torch.float32).to(tdtype)
    out = torch.empty(n, n, device=dev, dtype=tdtype)
    mm = lambda: torch.matmul(a, b, out=out)  # noqa: E731
    if on_cuda:
        mm_samples = _cuda_time(mm, warmup=3, runs=10, inner=3)
    else:
        mm_samples = _time_median(mm, sync, warmup=1, runs=8, budget_s=1.5)
    mm_s = statistics.median(mm_samples)
    flops = 2.0 * n**3 / mm_s
    del a, b, out
    if on_cuda:
        torch.cuda.empty_cache()

    return bandwidth, bw_samples, bw_s, n, flops, mm_samples, mm_s


def measure_ceilings(
    device: str = "cpu",
    dtype: str | None = None,
    *,
    copy_bytes: int | None = None,
    matmul_n: int | None = None,
) -> dict[str, Any]:
    """Measure memory bandwidth and matmul rate of ``device`` ("cpu", "cuda" or "cuda:N").

    Bandwidth: ``dst.copy_(src)`` of one buffer of ``copy_bytes`` (CUDA: 1 GiB,
    capped at a quarter of free memory; CPU: 256 MiB, beyond last-level
    caches), counted as bytes read + written (``2 * copy_bytes``) per copy;
    median over timed repetitions after warm-up copies.
    Matmul: ``a @ b`` of two ``n x n`` matrices in ``dtype`` (default
    bfloat16 on CUDA, float32 on CPU; CUDA n=8192, CPU n=1024), ``2 n^3``
    FLOPs per product; median after warm-up. On CPU the whole measurement
    takes a few seconds at most, with the current torch thread count.

    Returns ``memory_bandwidth_bytes_per_s``, ``matmul_flops_per_s``,
    ``matmul_dtype``, ``device``, ``device_name``, ``measured_at`` (ISO UTC),
    ``date``, ``torch_version``, ``threads`` (CPU), ``bandwidth`` and
    ``matmul`` (sizes, samples), and ``key`` (device name + dtype: what to
    cache the ceilings under).
    """
    import torch

    from inferloom.models.presets import parse_dtype

    dev = torch.device(device)
    on_cuda = dev.type == "cuda"
    if on_cuda and not torch.cuda.is_available():
        raise RuntimeError(f"measure_ceilings: device {device!r} requested but CUDA is not available")
    dtype = dtype or ("bfloat16" if on_cuda else "float32")
    tdtype = parse_dtype(dtype)
    if on_cuda:
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        name = torch.cuda.get_device_name(dev)
        free, _total = torch.cuda.mem_get_info(dev)
        nbytes = int(copy_bytes or min(1 << 30, free // 4))
    else:
        name = _cpu_name()
        nbytes = int(copy_bytes or (256 << 20))
    nbytes = max(1 << 20, nbytes - nbytes % 4096)

    with torch.cuda.device(dev) if on_cuda else contextlib.nullcontext():
        bandwidth, bw_samples, bw_s, n, flops, mm_samples, mm_s = _measure(
            dev, on_cuda, nbytes, tdtype, matmul_n
        )

    now = _dt.datetime.now(_dt.timezone.utc)
    return {
        "device": dev.type,
        "device_name": name,
        "measured_at": now.isoformat(timespec="seconds"),
        "date": now.date().isoformat(),
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads() if not on_cuda else None,
        "memory_bandwidth_bytes_per_s": float(bandwidth),
        "matmul_flops_per_s": float(flops),
        "matmul_dtype": dtype,
        "bandwidth": {
            "method": "dst.copy_(src), bytes read + written",
            "bytes_per_copy": nbytes,
            "samples_s": [float(x) for x in bw_samples],
            "median_s": float(bw_s),
        },
        "matmul": {
            "method": "a @ b, n x n, 2 n^3 FLOPs",
            "n": n,
            "dtype": dtype,
            "samples_s": [float(x) for x in mm_samples],
            "median_s": float(mm_s),
        },
        "key": f"{name}|{dtype}",
    }


# ------------------------------------------------------------------ shapes
_SHAPE_KEYS = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "intermediate_size": ("intermediate_size", "ffn_dim", "n_inner"),
    "num_layers": ("num_hidden_layers", "num_layers", "n_layer"),
    "num_heads": ("num_attention_heads", "n_head", "num_heads"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "head_dim": ("head_dim",),
    "vocab_size": ("vocab_size",),
    "tie_word_embeddings": ("tie_word_embeddings",),
}


def model_shape(model: Any) -> dict[str, Any]:
    """The shape a cost model needs, from a preset name, a ``PRESETS`` entry,
    a :func:`~inferloom.models.presets.model_info` dict, a Hugging Face config
    (object or dict; its text config for multimodal ones) or a built model."""
    if isinstance(model, str):
        from inferloom.models.presets import PRESETS

        if model in PRESETS:
            model = PRESETS[model]
        else:
            from transformers import AutoConfig

            model = AutoConfig.from_pretrained(model, local_files_only=True)
    cfg = getattr(model, "config", model)  # a built model
    if hasattr(cfg, "get_text_config"):
        cfg = cfg.get_text_config()

    def get(key: str) -> Any:
        for k in _SHAPE_KEYS[key]:
            v = cfg.get(k) if isinstance(cfg, Mapping) else getattr(cfg, k, None)
            if v is not None:
                return v
        return None

    shape = {k: get(k) for k in _SHAPE_KEYS}
    missing = [k for k in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "vocab_size")
               if shape[k] is None]
    if missing:
        raise ValueError(f"model shape: missing {', '.join(missing)}")
    for k in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "vocab_size"):
        shape[k] = int(shape[k])
    shape["num_kv_heads"] = int(shape["num_kv_heads"] or shape["num_heads"])
    shape["head_dim"] = int(shape["head_dim"] or shape["hidden_size"] // shape["num_heads"])
    shape["tie_word_embeddings"] = bool(shape["tie_word_embeddings"] or False)
    return shape


def _derived(shape: Mapping[str, Any], dtype_bytes: float, kv_dtype_bytes: float) -> dict[str, Any]:
    h, inter, nl = shape["hidden_size"], shape["intermediate_size"], shape["num_layers"]
    nh, nkv, d, v = shape["num_heads"], shape["num_kv_heads"], shape["head_dim"], shape["vocab_size"]
    p_attn = h * (nh * d) + 2 * h * (nkv * d) + (nh * d) * h
    p_mlp = 3 * h * inter
    p_norm = 2 * h
    p_mm = nl * (p_attn + p_mlp) + v * h
    params = nl * (p_attn + p_mlp + p_norm) + h + v * h + (0 if shape["tie_word_embeddings"] else v * h)
    a_layer = (h + (nh + 2 * nkv) * d) + (2 * nh * d) + (nh * d + h) + (h + 2 * inter) + (inter + h)
    return {
        "params_attn_per_layer": p_attn,
        "params_mlp_per_layer": p_mlp,
        "params_norm_per_layer": p_norm,
        "matmul_params": p_mm,
        "parameters": params,
        "weight_bytes": params * dtype_bytes,
        "weights_read_bytes": (p_mm + nl * p_norm + h) * dtype_bytes,
        "kv_bytes_per_token": 2 * nl * nkv * d * kv_dtype_bytes,
        "activation_elems_per_token_layer": a_layer,
        "attention_flops_per_token_per_ctx": 4 * nl * nh * d,
    }


def _decode(shape: Mapping[str, Any], der: Mapping[str, Any], b: int, c: float, B: float) -> dict[str, Any]:
    h, nl, v = shape["hidden_size"], shape["num_layers"], shape["vocab_size"]
    kv_tok = der["kv_bytes_per_token"]
    bytes_ = {
        "weights": der["weights_read_bytes"] + B * b * h,
        "kv_cache_read": b * c * kv_tok,
        "kv_cache_write": b * kv_tok,
        "activations": B * b * (nl * der["activation_elems_per_token_layer"] + h + v),
    }
    flops_ = {
        "matmul": 2.0 * b * der["matmul_params"],
        "attention": b * der["attention_flops_per_token_per_ctx"] * c,
    }
    return _phase(bytes_, flops_, tokens=b)


def _prefill(shape: Mapping[str, Any], der: Mapping[str, Any], b: int, L: int, B: float) -> dict[str, Any]:
    h, nl, v = shape["hidden_size"], shape["num_layers"], shape["vocab_size"]
    kv_tok = der["kv_bytes_per_token"]
    per_layer_mm = der["params_attn_per_layer"] + der["params_mlp_per_layer"]
    bytes_ = {
        "weights": der["weights_read_bytes"] + B * b * L * h,
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


def mean_decode_context(input_len: int, output_len: int) -> float:
    """Mean KV length over the ``output_len - 1`` decode steps of one
    ``generate()`` (contexts ``L+1 .. L+n-1``): ``L + n/2``."""
    return float(input_len) + float(output_len) / 2.0


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
        dtype_bytes = _DTYPE_BYTES[dtype_bytes]
    if isinstance(kv_dtype_bytes, str):
        kv_dtype_bytes = _DTYPE_BYTES[kv_dtype_bytes]
    B = float(dtype_bytes)
    Bkv = float(kv_dtype_bytes if kv_dtype_bytes is not None else dtype_bytes)
    if batch < 1 or context_len < 0 or B <= 0 or Bkv <= 0:
        raise ValueError("step_costs: batch >= 1, context_len >= 0 and positive byte sizes expected")
    shape = model_shape(model_config_or_info)
    der = _derived(shape, B, Bkv)
    L = int(input_len if input_len is not None else max(1, round(context_len)))
    return {
        "model": {**shape, **{k: (float(x) if isinstance(x, float) else int(x)) for k, x in der.items()}},
        "batch": int(batch),
        "context_len": float(context_len),
        "input_len": L,
        "dtype_bytes": B,
        "kv_dtype_bytes": Bkv,
        "decode_step": _decode(shape, der, int(batch), float(context_len), B),
        "prefill": _prefill(shape, der, int(batch), L, B),
        "formulas": "see inferloom.measure.roofline module docstring",
    }


# ---------------------------------------------------------------- roofline
def _floors(phase: Mapping[str, Any], bw: float, peak: float) -> dict[str, Any]:
    t_bw = phase["bytes"] / bw
    t_cmp = phase["flops"] / peak
    return {
        "bandwidth_s": t_bw,
        "compute_s": t_cmp,
        "floor_s": max(t_bw, t_cmp),
        "bound": "memory" if t_bw >= t_cmp else "compute",
    }


def roofline(
    ceilings: Mapping[str, Any],
    costs: Mapping[str, Any],
    measured_tok_per_s: float | None,
    batch: int,
    output_len: int,
    input_len: int,
    *,
    tolerance: float = 0.02,
) -> dict[str, Any]:
    """Time floors of one ``generate()`` of ``batch`` sequences (``input_len``
    in, ``output_len`` out), the achievable output tok/s and where
    ``measured_tok_per_s`` sits against it.

    ``ceilings``: :func:`measure_ceilings`'s dict (or any mapping with
    ``memory_bandwidth_bytes_per_s`` and ``matmul_flops_per_s``). ``costs``:
    :func:`step_costs`'s dict; its model shape and dtypes are used, the batch
    and lengths come from the arguments (decode at the mean context
    ``input_len + output_len/2``).

    Returns per phase the bandwidth-bound, compute-bound and roofline floors;
    per run ``bandwidth_floor_s`` (all bytes / bandwidth), ``compute_floor_s``
    (all FLOPs / matmul rate) and ``floor_s`` (sum of per-phase maxima);
    ``ceiling_tok_per_s`` (``batch*output_len / floor_s``, prefill included,
    like the measured metric), ``decode_only_ceiling_tok_per_s``
    (``batch / decode_step_floor``); ``fraction`` (measured / ceiling),
    ``decode_only_fraction``, ``headroom`` (ceiling / measured: how many times
    faster the floor allows) and ``suspect`` (fraction above ``1 + tolerance``:
    faster than the hardware allows, so the measurement or the cost model is
    wrong, e.g. speculative decoding, which emits several tokens per weight
    read and so is not bound by this per-token floor).
    """
    bw = float(ceilings["memory_bandwidth_bytes_per_s"])
    peak = float(ceilings["matmul_flops_per_s"])
    if not (bw > 0 and peak > 0 and math.isfinite(bw) and math.isfinite(peak)):
        raise ValueError("roofline: ceilings must be positive and finite")
    if batch < 1 or output_len < 1 or input_len < 1:
        raise ValueError("roofline: batch, output_len and input_len must be >= 1")
    m = costs["model"]
    shape = {k: m[k] for k in _SHAPE_KEYS}
    B, Bkv = float(costs["dtype_bytes"]), float(costs["kv_dtype_bytes"])
    der = _derived(shape, B, Bkv)
    ctx = mean_decode_context(input_len, output_len)
    dec = _decode(shape, der, batch, ctx, B)
    pre = _prefill(shape, der, batch, input_len, B)
    f_dec, f_pre = _floors(dec, bw, peak), _floors(pre, bw, peak)
    steps = output_len - 1
    floor_s = f_pre["floor_s"] + steps * f_dec["floor_s"]
    bw_floor = f_pre["bandwidth_s"] + steps * f_dec["bandwidth_s"]
    cmp_floor = f_pre["compute_s"] + steps * f_dec["compute_s"]
    ceiling = batch * output_len / floor_s
    dec_ceiling = batch / f_dec["floor_s"]
    out: dict[str, Any] = {
        "ceilings": {
            "memory_bandwidth_bytes_per_s": bw,
            "matmul_flops_per_s": peak,
            "date": ceilings.get("date"),
            "device_name": ceilings.get("device_name"),
        },
        "batch": int(batch),
        "input_len": int(input_len),
        "output_len": int(output_len),
        "decode_steps": steps,
        "mean_decode_context": ctx,
        "decode_step": {**f_dec, "bytes": dec["bytes"], "flops": dec["flops"]},
        "prefill": {**f_pre, "bytes": pre["bytes"], "flops": pre["flops"]},
        "bandwidth_floor_s": bw_floor,
        "compute_floor_s": cmp_floor,
        "floor_s": floor_s,
        "ceiling_tok_per_s": ceiling,
        "decode_only_ceiling_tok_per_s": dec_ceiling,
        "measured_tok_per_s": None,
        "fraction": None,
        "decode_only_fraction": None,
        "headroom": None,
        "suspect": False,
        "tolerance": tolerance,
    }
    if measured_tok_per_s is not None:
        meas = float(measured_tok_per_s)
        if not (meas > 0 and math.isfinite(meas)):
            raise ValueError(f"roofline: measured_tok_per_s={measured_tok_per_s!r}, expected a positive number")
        frac = meas / ceiling
        out.update(
            measured_tok_per_s=meas,
            fraction=frac,
            decode_only_fraction=meas / dec_ceiling,
            headroom=ceiling / meas,
            suspect=frac > 1.0 + tolerance,
        )
        if out["suspect"]:
            out["reason"] = (
                f"measured {meas:.4g} tok/s is {frac:.2f}x the roofline ceiling {ceiling:.4g} tok/s"
            )
    return out


# ------------------------------------------------------------------ Amdahl
def amdahl_limit(fraction_affected: float, local_speedup: float = math.inf) -> float:
    """Amdahl's law: the whole-run speedup when a part taking
    ``fraction_affected`` of the time gets ``local_speedup`` times faster:
    ``1 / ((1 - p) + p / s)`` (``s`` infinite: ``1 / (1 - p)``)."""
    p = float(fraction_affected)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"amdahl_limit: fraction_affected={p}, expected [0, 1]")
    s = float(local_speedup)
    if s <= 0:
        raise ValueError(f"amdahl_limit: local_speedup={s}, expected > 0")
    rest = (1.0 - p) + (0.0 if math.isinf(s) else p / s)
    return math.inf if rest <= 0 else 1.0 / rest


def amdahl_check(measured_gain: float, max_possible_gain: float | None, *, tolerance: float = 0.05) -> dict[str, Any]:
    """Flag a measured gain the roofline or Amdahl's law says is impossible.

    Gains are speedup ratios (candidate tok/s over baseline tok/s; 1.25 is
    +25%). ``max_possible_gain``: the largest gain allowed, e.g. the stock
    roofline ``headroom`` or :func:`amdahl_limit` of the profiled share a
    change touches (None or inf: no limit known). ``suspect`` when
    ``measured_gain > max_possible_gain * (1 + tolerance)`` (the tolerance
    absorbs measurement noise and the cost model's approximations).
    """
    g = float(measured_gain)
    if not (g > 0 and math.isfinite(g)):
        raise ValueError(f"amdahl_check: measured_gain={measured_gain!r}, expected a positive ratio")
    limit = None if max_possible_gain is None else float(max_possible_gain)
    if limit is not None and not limit > 0:
        raise ValueError(f"amdahl_check: max_possible_gain={max_possible_gain!r}, expected > 0")
    known = limit is not None and math.isfinite(limit)
    suspect = bool(known and g > limit * (1.0 + tolerance))
    out: dict[str, Any] = {
        "measured_gain": g,
        "max_possible_gain": limit if known else None,
        "tolerance": tolerance,
        "margin": (g / limit) if known else None,
        "suspect": suspect,
        "verdict": "suspect" if suspect else ("ok" if known else "unbounded"),
    }
    if suspect:
        out["reason"] = f"measured gain {g:.3f}x exceeds the {limit:.3f}x the roofline / Amdahl's law allows"
    return out
