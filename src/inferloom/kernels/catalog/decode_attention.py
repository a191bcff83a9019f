"""Decode attention over a static KV cache, flash-decoding style (Triton).

Replaces, at decode (one new token per sequence), HF's SDPA call over the
whole padded static cache with a mask (and the copies around it).

Supports:

* query ``[B, Hq, 1, D]`` (any strides), cache ``k_cache``/``v_cache``
  ``[B, Hkv, S_max, D]`` (any strides, last one ideally 1), GQA with
  ``Hq % Hkv == 0`` (the 8B shape: 32 query heads over 8 KV heads, groups of
  4; each program loads a K/V tile once for its whole group);
* per-sequence lengths ``seq_lens[B]`` (int32/int64, on the device): row b
  attends over cache positions ``[starts[b], seq_lens[b])`` only; positions
  outside are never loaded (masked loads), so the padded tail is never read
  and nothing is copied. ``starts`` (optional, default 0) is the left-padding
  offset of a left-padded batch. Needs ``0 <= starts[b] < seq_lens[b] <=
  S_max``; a row with no position to attend to gives NaN (made visible, not
  hidden);
* head_dim any size up to 256 (padded to a power of two inside);
* float16 / bfloat16 (fp32 accumulation); float32 (IEEE dots, for testing);
* scale: ``1/sqrt(D)`` by default, or given.

Doesn't support: more than one query token per sequence (no prefill, no
speculative verification), sliding windows, ALiBi / softcapping, paged
caches, fp8 caches.

From HF's static cache at a decode step (left-padded batch, every row
writing at the same ``cache_position``): ``seq_lens[b] = cache_position + 1``
for every row and ``starts[b]`` = the row's number of left-pad tokens
(``attention_mask[b].argmax()`` of the 0/1 mask, taken once after prefill).
The new token's K/V must already be in the cache (HF's ``cache.update``
writes it before attention runs).

How: stage 1 runs one program per (sequence, KV head, chunk of ``chunk``
cache positions); it keeps an online softmax over ``block_n``-wide tiles and
writes the chunk's normalised partial output and its log-sum-exp (base 2).
Chunks wholly outside ``[start, len)`` write an empty partial (lse = -inf)
without loading anything; inside a chunk, tiles are masked (a static trip
count of ``chunk / block_n``). Stage 2 merges the partials of each (sequence, query
head) by their log-sum-exp. The grid depends only on ``S_max`` (not on the
lengths), so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch
import triton
import triton.language as tl

from inferloom.kernels.catalog import tuning
from inferloom.kernels.catalog.entry import DTYPES, CatalogEntry, randn, rng

__all__ = ["decode_attention", "decode_attention_reference", "sdpa_static_baseline", "sdpa_gqa_baseline", "ENTRY"]

DEFAULT_CONFIG = {"chunk": 64, "block_n": 32, "num_warps": 4, "num_stages": 2}
TUNE_SPACE = tuple(
    {"chunk": c, "block_n": n, "num_warps": w, "num_stages": s}
    for c, n, w, s in [
        (32, 32, 4, 2), (64, 32, 4, 2), (64, 64, 4, 2), (128, 64, 4, 2), (128, 32, 4, 3),
        (128, 64, 8, 2), (256, 64, 4, 2), (64, 16, 2, 2), (128, 128, 8, 2),
    ]
)
_LOG2E = 1.4426950408889634


@triton.jit
def _decode_attn_split_kernel(
    Q, K, V, SeqLens, Starts, Opart, Lse,
    s_qb, s_qh, s_qd,
    s_kb, s_kh, s_ks, s_kd,
    s_vb, s_vh, s_vs, s_vd,
    s_ob, s_oh, s_os, s_od,
    s_lb, s_lh, s_ls,
    qk_scale, head_dim,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, CHUNK: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, HAS_STARTS: tl.constexpr, DOT_PREC: tl.constexpr,
):
    b = tl.program_id(0)
    hkv = tl.program_id(1)
    split = tl.program_id(2)
    end = tl.load(SeqLens + b).to(tl.int32)
    if HAS_STARTS:
        start = tl.load(Starts + b).to(tl.int32)
    else:
        start = 0
    c_lo = split * CHUNK
    lo = tl.maximum(c_lo, start)
    hi = tl.minimum(c_lo + CHUNK, end)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    g_mask = offs_g < GROUP
    d_mask = offs_d < head_dim
    heads = hkv * GROUP + offs_g

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    if lo < hi:
        q = tl.load(Q + b * s_qb + heads[:, None] * s_qh + offs_d[None, :] * s_qd,
                    mask=g_mask[:, None] & d_mask[None, :], other=0.0)
        k_base = K + b * s_kb + hkv * s_kh
        v_base = V + b * s_vb + hkv * s_vh
        # A static trip count (the interpreter can't loop over a loaded bound); tiles
        # outside [lo, hi) are fully masked: no memory traffic, and -inf rows stay empty.
        for i in range(0, CHUNK // BLOCK_N):
            pos = c_lo + i * BLOCK_N + offs_n
            valid = (pos >= lo) & (pos < hi)
            kv_mask = valid[:, None] & d_mask[None, :]
            k = tl.load(k_base + pos[:, None] * s_ks + offs_d[None, :] * s_kd, mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale  # [BLOCK_G, BLOCK_N], log2 units
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_use)
            p = tl.exp2(s - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_base + pos[:, None] * s_vs + offs_d[None, :] * s_vd, mask=kv_mask, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
            m_i = m_new
    has = l_i > 0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    tl.store(Opart + b * s_ob + heads[:, None] * s_oh + split * s_os + offs_d[None, :] * s_od, o,
             mask=g_mask[:, None] & d_mask[None, :])
    tl.store(Lse + b * s_lb + heads * s_lh + split * s_ls, lse, mask=g_mask)


@triton.jit
def _decode_attn_merge_kernel(
    Opart, Lse, Out, n_splits, head_dim,
    s_ob, s_oh, s_os, s_od,
    s_lb, s_lh, s_ls,
    s_outb, s_outh, s_outd,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < n_splits
    d_mask = offs_d < head_dim
    lse = tl.load(Lse + b * s_lb + h * s_lh + offs_s * s_ls, mask=s_mask, other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.exp2(lse - m)  # NaN when every split is empty (m = -inf): made visible on purpose
    o = tl.load(Opart + b * s_ob + h * s_oh + offs_s[:, None] * s_os + offs_d[None, :] * s_od,
                mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.sum(w, 0)
    tl.store(Out + b * s_outb + h * s_outh + offs_d * s_outd, out.to(Out.dtype.element_ty), mask=d_mask)


def _tune_shape(q: torch.Tensor, k_cache: torch.Tensor) -> dict[str, int]:
    b, hq, _, d = q.shape
    return {"batch": b, "q_heads": hq, "kv_heads": k_cache.shape[1], "head_dim": d, "max_len": k_cache.shape[2]}


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_lens: torch.Tensor,
                     starts: torch.Tensor | None = None, scale: float | None = None, *,
                     out: torch.Tensor | None = None, config: Mapping[str, Any] | None = None,
                     _merge_splits: int | None = None) -> torch.Tensor:
    """Attention of one query token per sequence over ``[starts, seq_lens)`` of a static cache.

    Returns ``out`` ``[B, Hq, 1, D]`` in ``q``'s dtype (written in place when
    given). ``config``: ``chunk``, ``block_n``, ``num_warps``, ``num_stages``
    (default: the tuned one cached for this device, see :mod:`.tuning`).
    ``_merge_splits`` is for tests only (a broken variant that drops chunks).
    """
    B, Hq, one, D = q.shape
    Bk, Hkv, S_max, Dk = k_cache.shape
    if one != 1:
        raise ValueError(f"decode_attention takes one query token per sequence, got q {tuple(q.shape)}")
    if (Bk, Dk) != (B, D) or tuple(v_cache.shape) != tuple(k_cache.shape) or Hq % Hkv:
        raise ValueError(f"shapes: q {tuple(q.shape)}, k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}")
    if D > 256:
        raise ValueError(f"head_dim {D} > 256 is not supported")
    if config is None:
        config = tuning.lookup("decode_attention", str(q.dtype).removeprefix("torch."), _tune_shape(q, k_cache),
                               q.device, DEFAULT_CONFIG)
    chunk, block_n = int(config["chunk"]), int(config["block_n"])
    block_n = min(block_n, chunk)
    if chunk % block_n:
        raise ValueError(f"chunk {chunk} must be a multiple of block_n {block_n}")
    group = Hq // Hkv
    n_splits = triton.cdiv(S_max, chunk)
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    opart = torch.empty((B, Hq, n_splits, D), dtype=torch.float32, device=q.device)
    lse = torch.empty((B, Hq, n_splits), dtype=torch.float32, device=q.device)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    block_d = max(16, triton.next_power_of_2(D))
    prec = "ieee" if q.dtype == torch.float32 else "tf32"
    _decode_attn_split_kernel[(B, Hkv, n_splits)](
        q, k_cache, v_cache, seq_lens, starts if starts is not None else seq_lens, opart, lse,
        q.stride(0), q.stride(1), q.stride(3),
        *k_cache.stride(), *v_cache.stride(),
        *opart.stride(), *lse.stride(),
        scale * _LOG2E, D,
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), CHUNK=chunk, BLOCK_N=block_n,
        BLOCK_D=block_d, HAS_STARTS=starts is not None, DOT_PREC=prec,
        num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]),
    )
    merge = n_splits if _merge_splits is None else _merge_splits
    _decode_attn_merge_kernel[(B, Hq)](
        opart, lse, out, merge, D,
        *opart.stride(), *lse.stride(),
        out.stride(0), out.stride(1), out.stride(3),
        BLOCK_S=max(2, triton.next_power_of_2(n_splits)), BLOCK_D=block_d, num_warps=4,
    )
    return out


def decode_attention_reference(q, k_cache, v_cache, seq_lens, starts=None, scale=None):
    """float64 truth: per row, softmax over exactly ``[starts[b], seq_lens[b])``."""
    B, Hq, _, D = q.shape
    group = Hq // k_cache.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out = torch.empty((B, Hq, 1, D), dtype=torch.float64, device=q.device)
    lens = seq_lens.tolist()
    st = starts.tolist() if starts is not None else [0] * B
    for b in range(B):
        k = k_cache[b, :, st[b]:lens[b]].to(torch.float64).repeat_interleave(group, 0)  # [Hq, L, D]
        v = v_cache[b, :, st[b]:lens[b]].to(torch.float64).repeat_interleave(group, 0)
        qq = q[b].to(torch.float64)  # [Hq, 1, D]
        p = torch.softmax(qq @ k.transpose(1, 2) * scale, dim=-1)
        out[b] = p @ v
    return out


def _static_mask(q, k_cache, seq_lens, starts):
    pos = torch.arange(k_cache.shape[2], device=q.device)
    mask = pos[None, :] < seq_lens[:, None]
    if starts is not None:
        mask &= pos[None, :] >= starts[:, None]
    return mask[:, None, None, :]


def sdpa_static_baseline(q, k_cache, v_cache, seq_lens, starts=None, scale=None):
    """What HF transformers 5.x runs at decode with a static cache on CUDA in a
    compiled decode step: with a mask, ``sdpa_attention_forward`` expands the KV
    heads (``repeat_kv``: a copy of the whole padded cache, times the group
    size), then SDPA over all ``S_max`` slots with a boolean mask. (Eager, 5.17
    packs the query heads instead, ``pack_gqa``: closer to :func:`sdpa_gqa_baseline`.) The mask is built here at each call;
    HF builds it once per step for all layers (a few µs of small kernels)."""
    group = q.shape[1] // k_cache.shape[1]
    k, v = k_cache, v_cache
    if group > 1:
        B, H, S, D = k_cache.shape
        k = k_cache[:, :, None].expand(B, H, group, S, D).reshape(B, H * group, S, D)
        v = v_cache[:, :, None].expand(B, H, group, S, D).reshape(B, H * group, S, D)
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=_static_mask(q, k_cache, seq_lens, starts), scale=scale)


def sdpa_gqa_baseline(q, k_cache, v_cache, seq_lens, starts=None, scale=None):
    """A stronger torch competitor: SDPA with ``enable_gqa`` (no ``repeat_kv`` copy), still
    over all ``S_max`` slots with a mask."""
    return torch.nn.functional.scaled_dot_product_attention(
        q, k_cache, v_cache, attn_mask=_static_mask(q, k_cache, seq_lens, starts), scale=scale,
        enable_gqa=q.shape[1] != k_cache.shape[1])


def make_inputs(shape: Mapping[str, int], dtype: str, device: str, seed: int):
    """Shape keys: batch, q_heads, kv_heads, head_dim, max_len, and either
    ``context`` (every row that long) or ``ragged=1`` (random lengths in
    ``[1, max_len]``, with row 0 of length 1 and the last row of length
    ``max_len``); ``left_pad=1`` adds random start offsets; ``poison_tail``
    (default 1) fills every cache slot outside ``[start, len)`` with NaN, so a
    kernel that reads (and uses) the padding fails the check."""
    dt = DTYPES[dtype]
    g = rng(device, seed)
    B, Hq, Hkv, D, S = (int(shape[k]) for k in ("batch", "q_heads", "kv_heads", "head_dim", "max_len"))
    if shape.get("ragged"):
        lens = torch.randint(1, S + 1, (B,), generator=g, device=device)
        lens[0] = 1
        lens[-1] = S
    else:
        lens = torch.full((B,), int(shape.get("context", S)), device=device)
    starts = None
    if shape.get("left_pad"):
        starts = (torch.rand(B, generator=g, device=device) * lens).long().clamp(max=lens - 1)
        starts[0] = 0
    q = randn(g, (B, 1, Hq, D), dt).transpose(1, 2)  # HF's strided view of q_proj's output
    k = randn(g, (B, Hkv, S, D), dt)
    v = randn(g, (B, Hkv, S, D), dt)
    if shape.get("poison_tail", 1):
        pos = torch.arange(S, device=device)
        outside = pos[None, :] >= lens[:, None]
        if starts is not None:
            outside |= pos[None, :] < starts[:, None]
        k.masked_fill_(outside[:, None, :, None], float("nan"))
        v.masked_fill_(outside[:, None, :, None], float("nan"))
    inputs = {"q": q, "k_cache": k, "v_cache": v, "seq_lens": lens.to(torch.int32),
              "starts": None if starts is None else starts.to(torch.int32)}
    out = torch.empty((B, Hq, 1, D), dtype=dt, device=device)
    return inputs, out


def fit_shape(shape: Mapping[str, int]) -> dict[str, int]:
    """``shape`` made valid for :func:`make_inputs` after its dimensions were moved one by one (the
    reward-hacking guards' unseen shapes): ``q_heads`` the nearest multiple of ``kv_heads`` (at least one
    group), ``context`` at most ``max_len``."""
    s = {k: int(v) for k, v in shape.items()}
    kv = s["kv_heads"]
    s["q_heads"] = kv * max(1, round(s["q_heads"] / kv))
    if "context" in s:
        s["context"] = min(s["context"], s["max_len"])
    return s


def _impl(q, k_cache, v_cache, seq_lens, starts=None, scale=None, *, out, config=None):
    decode_attention(q, k_cache, v_cache, seq_lens, starts, scale, out=out, config=config)


ENTRY = CatalogEntry(
    name="decode_attention",
    target="attention",
    target_op="scaled_dot_product_attention at decode (q_len 1) over a padded static KV cache with a mask",
    implementation=_impl,
    reference=decode_attention_reference,
    baseline=sdpa_static_baseline,
    make_inputs=make_inputs,
    tolerances={
        "float32": {"rel_l2": 1e-5, "max_rel": 1e-4},
        "float16": {"rel_l2": 3e-3, "max_rel": 1e-2},
        "bfloat16": {"rel_l2": 1.5e-2, "max_rel": 4e-2},
    },
    tune_space=TUNE_SPACE,
    default_config=DEFAULT_CONFIG,
    tune_keys=("batch", "q_heads", "kv_heads", "head_dim", "max_len"),
    notes="flash-decoding split over the KV length + log-sum-exp merge; GQA; per-row [start, len)",
    shape_fit=fit_shape,
)
