import math

import triton
import triton.language as tl


@triton.jit
def _decode_blocked(Q, K, V, Lens, Starts, Out, s_qb, s_qh, s_qd, s_kb, s_kh, s_ks, s_kd, s_vb, s_vh, s_vs, s_vd,
                    s_ob, s_oh, s_od, group, head_dim, scale,
                    NUM_BLOCKS: tl.constexpr, HAS_STARTS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    h = tl.program_id(0)  # the query heads of one KV head run side by side: their K/V tiles come from L2
    b = tl.program_id(1)
    kvh = h // group
    end = tl.load(Lens + b).to(tl.int32)
    if HAS_STARTS:
        start = tl.load(Starts + b).to(tl.int32)
    else:
        start = 0
    d = tl.arange(0, BLOCK_D)
    dm = d < head_dim
    q = tl.load(Q + b * s_qb + h * s_qh + d * s_qd, mask=dm, other=0.0).to(tl.float32) * scale
    m_i = tl.max(tl.full([BLOCK_N], float("-inf"), tl.float32), 0)
    l_i = tl.sum(tl.zeros([BLOCK_N], tl.float32), 0)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for i in range(0, NUM_BLOCKS):  # a static trip count over the cache; loads masked to [start, end): the padding is never read
        pos = i * BLOCK_N + tl.arange(0, BLOCK_N)
        valid = (pos >= start) & (pos < end)
        m2 = valid[:, None] & dm[None, :]
        k = tl.load(K + b * s_kb + kvh * s_kh + pos[:, None] * s_ks + d[None, :] * s_kd, mask=m2, other=0.0)
        s = tl.where(valid, tl.sum(k.to(tl.float32) * q[None, :], 1), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.where(m_new == float("-inf"), 1.0, tl.exp(m_i - m_new))  # nothing valid yet: nothing to rescale
        p = tl.where(valid, tl.exp(s - m_new), 0.0)
        v = tl.load(V + b * s_vb + kvh * s_vh + pos[:, None] * s_vs + d[None, :] * s_vd, mask=m2, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    tl.store(Out + b * s_ob + h * s_oh + d * s_od, acc / l_i, mask=dm)


def kernel(q, k_cache, v_cache, seq_lens, starts=None, scale=None, *, out):
    B, Hq, _, D = q.shape
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    block_d = triton.next_power_of_2(D)
    block_n = 64 if block_d <= 128 else 32
    _decode_blocked[(Hq, B)](q, k_cache, v_cache, seq_lens, starts if starts is not None else seq_lens, out,
                             q.stride(0), q.stride(1), q.stride(3), *k_cache.stride(), *v_cache.stride(),
                             out.stride(0), out.stride(1), out.stride(3), Hq // Hkv, D, scale, NUM_BLOCKS=triton.cdiv(S, block_n),
                             HAS_STARTS=starts is not None, BLOCK_N=block_n, BLOCK_D=block_d)
