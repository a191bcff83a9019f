"""The MLP's gate/up projection with its SiLU·mul, and fused projection weights.

Three entries:

* ``gate_up_silu`` (Triton): ``out = silu(x @ Wg^T) * (x @ Wu^T)`` in one
  kernel over the concatenated weight ``w_gate_up = [Wg; Wu]`` (``[2I, K]``,
  made once by :func:`concat_gate_up`). Each program computes the same
  ``block_n`` columns of the gate and of the up product (two float32
  accumulators over K) and applies SiLU·mul in the epilogue, so neither
  ``[M, I]`` intermediate goes to memory. Rounds once to the dtype at the
  end (HF rounds the gate, the SiLU and the product separately: this is
  closer to the float64 truth, not bit-equal to HF). Supports x ``[M, K]``
  (any M; last dim contiguous), weights ``[2I, K]`` row-major as
  ``nn.Linear`` stores them, float16/bfloat16 (float32 with IEEE dots).
  No split-K, no bias, no fp8.
* ``silu_mul`` (Triton): ``out = silu(gu[:, :I]) * gu[:, I:]`` on the output
  of one concatenated gate/up GEMM (the cheaper fallback: cuBLAS GEMM +
  one elementwise kernel). Computes in float32, rounds once.
* ``qkv_proj`` (torch): one GEMM over ``fuse_qkv_weights(Wq, Wk, Wv)``
  instead of three; :func:`split_qkv` gives the q/k/v views (no copies).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from inferloom.kernels.catalog import tuning
from inferloom.kernels.catalog.entry import DTYPES, CatalogEntry, randn, rng

__all__ = ["concat_gate_up", "fuse_qkv_weights", "split_qkv", "gate_up_silu", "silu_mul",
           "GATE_UP_ENTRY", "SILU_MUL_ENTRY", "QKV_ENTRY"]


# ---------------------------------------------------------------- weight helpers

def concat_gate_up(gate_w: torch.Tensor, up_w: torch.Tensor) -> torch.Tensor:
    """``[Wg; Wu]`` (``[2I, K]``, contiguous): do it once at load, not per step."""
    if gate_w.shape != up_w.shape:
        raise ValueError(f"gate {tuple(gate_w.shape)} vs up {tuple(up_w.shape)}")
    return torch.cat([gate_w, up_w], dim=0).contiguous()


def fuse_qkv_weights(q_w: torch.Tensor, k_w: torch.Tensor, v_w: torch.Tensor) -> torch.Tensor:
    """``[Wq; Wk; Wv]`` (``[(Hq + 2 Hkv) D, hidden]``): one GEMM instead of three."""
    if not (q_w.shape[1] == k_w.shape[1] == v_w.shape[1]) or k_w.shape != v_w.shape:
        raise ValueError(f"q {tuple(q_w.shape)}, k {tuple(k_w.shape)}, v {tuple(v_w.shape)}")
    return torch.cat([q_w, k_w, v_w], dim=0).contiguous()


def split_qkv(y: torch.Tensor, q_dim: int, kv_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views of q, k, v in the fused projection's output (no copies)."""
    return y[..., :q_dim], y[..., q_dim:q_dim + kv_dim], y[..., q_dim + kv_dim:q_dim + 2 * kv_dim]


# ---------------------------------------------------------------- gate/up GEMM + SiLU·mul

GATE_UP_DEFAULT = {"block_m": 64, "block_n": 64, "block_k": 64, "num_warps": 4, "num_stages": 4}
GATE_UP_TUNE = tuple(
    {"block_m": m, "block_n": n, "block_k": k, "num_warps": w, "num_stages": s}
    for m, n, k, w, s in [
        (64, 64, 64, 4, 4), (64, 32, 128, 4, 4), (64, 64, 128, 4, 3), (64, 128, 64, 8, 4),
        (64, 32, 64, 4, 5), (64, 64, 64, 8, 5), (32, 64, 128, 4, 4), (64, 128, 128, 8, 2),
        (64, 16, 128, 4, 4), (64, 32, 128, 4, 5),
    ]
)


@triton.jit
def _gemm_gate_up_silu_kernel(X, W, Out, M, N,
                         s_xm, s_wn, s_om,
                         K: tl.constexpr,  # constexpr: a static trip count (and the interpreter can't loop to a runtime one)
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         DOT_PREC: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_ptrs = X + offs_m[:, None] * s_xm + offs_k[None, :]
    g_ptrs = W + offs_n[:, None] * s_wn + offs_k[None, :]
    u_ptrs = W + (offs_n[:, None] + N) * s_wn + offs_k[None, :]
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = (k0 + offs_k) < K
        x = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        wg = tl.load(g_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        wu = tl.load(u_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        acc_g = tl.dot(x, tl.trans(wg), acc_g, input_precision=DOT_PREC)
        acc_u = tl.dot(x, tl.trans(wu), acc_u, input_precision=DOT_PREC)
        x_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    y = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    tl.store(Out + offs_m[:, None] * s_om + offs_n[None, :], y.to(Out.dtype.element_ty),
             mask=m_mask[:, None] & n_mask[None, :])


def gate_up_silu(x: torch.Tensor, w_gate_up: torch.Tensor, *, out: torch.Tensor | None = None,
                 config: Mapping[str, Any] | None = None) -> torch.Tensor:
    """``silu(x @ Wg^T) * (x @ Wu^T)`` with ``w_gate_up = concat_gate_up(Wg, Wu)``; x ``[..., K]``."""
    K = x.shape[-1]
    two_n, Kw = w_gate_up.shape
    if Kw != K or two_n % 2 or w_gate_up.stride(1) != 1 or x.stride(-1) != 1:
        raise ValueError(f"x {tuple(x.shape)} / w_gate_up {tuple(w_gate_up.shape)} (last dims contiguous)")
    N = two_n // 2
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    if out is None:
        out = torch.empty((*x.shape[:-1], N), dtype=x.dtype, device=x.device)
    o2 = out.view(-1, N)
    if config is None:
        config = tuning.lookup("gate_up_silu", str(x.dtype).removeprefix("torch."),
                               {"tokens": M, "hidden": K, "intermediate": N}, x.device, GATE_UP_DEFAULT)
    bm = min(int(config["block_m"]), max(16, triton.next_power_of_2(M)))
    bn, bk = int(config["block_n"]), int(config["block_k"])
    _gemm_gate_up_silu_kernel[(triton.cdiv(M, bm), triton.cdiv(N, bn))](
        x2, w_gate_up, o2, M, N, x2.stride(0), w_gate_up.stride(0), o2.stride(0),
        K=K, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, DOT_PREC="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=int(config["num_warps"]), num_stages=int(config["num_stages"]),
    )
    return out


def _gate_up_inputs(shape: Mapping[str, int], dtype: str, device: str, seed: int):
    """Shape keys: ``tokens``, ``hidden``, ``intermediate``. Weights ~ N(0, 1/hidden)."""
    dt = DTYPES[dtype]
    g = rng(device, seed)
    M, K, N = int(shape["tokens"]), int(shape["hidden"]), int(shape["intermediate"])
    x = randn(g, (M, K), dt)
    wg = randn(g, (N, K), dt, K ** -0.5)
    wu = randn(g, (N, K), dt, K ** -0.5)
    inputs = {"x": x, "w_gate_up": concat_gate_up(wg, wu)}
    return inputs, torch.empty((M, N), dtype=dt, device=device)


def _gate_up_reference(x, w_gate_up):
    N = w_gate_up.shape[0] // 2
    y = x.to(torch.float64) @ w_gate_up.to(torch.float64).t()
    return F.silu(y[:, :N]) * y[:, N:]


def _gate_up_baseline(x, w_gate_up):
    """HF's LlamaMLP front half, eager: two GEMMs (separate weights), SiLU, mul."""
    N = w_gate_up.shape[0] // 2
    return F.silu(F.linear(x, w_gate_up[:N])) * F.linear(x, w_gate_up[N:])


def _gate_up_impl(x, w_gate_up, *, out, config=None):
    gate_up_silu(x, w_gate_up, out=out, config=config)


GATE_UP_ENTRY = CatalogEntry(
    name="gate_up_silu",
    target="matmul",
    target_op="LlamaMLP: act_fn(gate_proj(x)) * up_proj(x) (two GEMMs + SiLU + mul)",
    implementation=_gate_up_impl,
    reference=_gate_up_reference,
    baseline=_gate_up_baseline,
    make_inputs=_gate_up_inputs,
    tolerances={
        "float32": {"rel_l2": 1e-5, "max_rel": 1e-4},
        "float16": {"rel_l2": 3e-3, "max_rel": 1e-2},
        "bfloat16": {"rel_l2": 1e-2, "max_rel": 3e-2},
    },
    tune_space=GATE_UP_TUNE,
    default_config=GATE_UP_DEFAULT,
    tune_keys=("tokens", "hidden", "intermediate"),
    notes="Triton GEMM over [Wg; Wu] with two accumulators and a SiLU·mul epilogue",
)


# ---------------------------------------------------------------- SiLU·mul on a concatenated output

SILU_DEFAULT = {"block": 1024, "num_warps": 4}
SILU_TUNE = ({"block": 512, "num_warps": 4}, {"block": 1024, "num_warps": 4}, {"block": 2048, "num_warps": 8},
             {"block": 4096, "num_warps": 8})


@triton.jit
def _silu_mul_kernel(GU, Out, N, s_gu, s_o, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    g = tl.load(GU + row * s_gu + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU + row * s_gu + N + cols, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(Out + row * s_o + cols, y.to(Out.dtype.element_ty), mask=mask)


def silu_mul(gu: torch.Tensor, *, out: torch.Tensor | None = None,
             config: Mapping[str, Any] | None = None) -> torch.Tensor:
    """``silu(gu[..., :I]) * gu[..., I:]`` for ``gu`` ``[..., 2I]`` (last dim contiguous)."""
    two_n = gu.shape[-1]
    if two_n % 2 or gu.stride(-1) != 1:
        raise ValueError(f"gu {tuple(gu.shape)}: last dim must be even and contiguous")
    N = two_n // 2
    g2 = gu.reshape(-1, two_n)
    if out is None:
        out = torch.empty((*gu.shape[:-1], N), dtype=gu.dtype, device=gu.device)
    o2 = out.view(-1, N)
    if config is None:
        config = tuning.lookup("silu_mul", str(gu.dtype).removeprefix("torch."),
                               {"tokens": g2.shape[0], "intermediate": N}, gu.device, SILU_DEFAULT)
    cfg = dict(config)
    block = min(int(cfg["block"]), triton.next_power_of_2(N))
    _silu_mul_kernel[(g2.shape[0], triton.cdiv(N, block))](
        g2, o2, N, g2.stride(0), o2.stride(0), BLOCK=block, num_warps=int(cfg["num_warps"]))
    return out


def _silu_inputs(shape: Mapping[str, int], dtype: str, device: str, seed: int):
    """Shape keys: ``tokens``, ``intermediate``."""
    dt = DTYPES[dtype]
    g = rng(device, seed)
    M, N = int(shape["tokens"]), int(shape["intermediate"])
    gu = randn(g, (M, 2 * N), dt, 2.0)
    return {"gu": gu}, torch.empty((M, N), dtype=dt, device=device)


def _silu_reference(gu):
    N = gu.shape[-1] // 2
    y = gu.to(torch.float64)
    return F.silu(y[:, :N]) * y[:, N:]


def _silu_baseline(gu):
    N = gu.shape[-1] // 2
    return F.silu(gu[:, :N]) * gu[:, N:]


def _silu_impl(gu, *, out, config=None):
    silu_mul(gu, out=out, config=config)


SILU_MUL_ENTRY = CatalogEntry(
    name="silu_mul",
    target="elementwise",
    target_op="act_fn(gate) * up on a concatenated gate/up GEMM output (SiLU kernel + mul kernel)",
    implementation=_silu_impl,
    reference=_silu_reference,
    baseline=_silu_baseline,
    make_inputs=_silu_inputs,
    tolerances={
        "float32": {"rel_l2": 1e-6, "max_rel": 1e-6},
        "float16": {"rel_l2": 1e-3, "max_rel": 1e-3},
        "bfloat16": {"rel_l2": 5e-3, "max_rel": 8e-3},
    },
    tune_space=SILU_TUNE,
    default_config=SILU_DEFAULT,
    tune_keys=("tokens", "intermediate"),
    notes="one read of [M, 2I], one write of [M, I]",
)


# ---------------------------------------------------------------- fused QKV projection (torch)

def _qkv_inputs(shape: Mapping[str, int], dtype: str, device: str, seed: int):
    """Shape keys: ``tokens``, ``hidden``, ``q_heads``, ``kv_heads``, ``head_dim``."""
    dt = DTYPES[dtype]
    g = rng(device, seed)
    M, K = int(shape["tokens"]), int(shape["hidden"])
    D = int(shape["head_dim"])
    qd, kvd = int(shape["q_heads"]) * D, int(shape["kv_heads"]) * D
    x = randn(g, (M, K), dt)
    ws = [randn(g, (n, K), dt, K ** -0.5) for n in (qd, kvd, kvd)]
    inputs = {"x": x, "w_qkv": fuse_qkv_weights(*ws), "q_dim": qd, "kv_dim": kvd}
    return inputs, torch.empty((M, qd + 2 * kvd), dtype=dt, device=device)


def _qkv_reference(x, w_qkv, q_dim, kv_dim):
    return x.to(torch.float64) @ w_qkv.to(torch.float64).t()


def _qkv_baseline(x, w_qkv, q_dim, kv_dim):
    """HF's attention front: three separate projections."""
    wq, wk, wv = split_qkv(w_qkv.t(), q_dim, kv_dim)
    return F.linear(x, wq.t()), F.linear(x, wk.t()), F.linear(x, wv.t())


def _qkv_impl(x, w_qkv, q_dim, kv_dim, *, out, config=None):
    torch.matmul(x, w_qkv.t(), out=out)


QKV_ENTRY = CatalogEntry(
    name="qkv_proj",
    target="matmul",
    target_op="LlamaAttention: q_proj(x), k_proj(x), v_proj(x) (three GEMMs)",
    implementation=_qkv_impl,
    reference=_qkv_reference,
    baseline=_qkv_baseline,
    make_inputs=_qkv_inputs,
    tolerances={
        "float32": {"rel_l2": 1e-5, "max_rel": 1e-4},
        "float16": {"rel_l2": 3e-3, "max_rel": 1e-2},
        "bfloat16": {"rel_l2": 1e-2, "max_rel": 3e-2},
    },
    notes="torch: one cuBLAS GEMM over the fused weight (made once by fuse_qkv_weights)",
)
