
import triton
import triton.language as tl


@triton.jit
def _silu_mul(GU, Out, M, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    row = offs // N
    col = offs % N
    g = tl.load(GU + row * 2 * N + col, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU + row * 2 * N + N + col, mask=mask, other=0.0)
    tl.store(Out + offs, g / (1.0 + tl.exp(-g)) * u, mask=mask)


def kernel(gu, *, out):
    gu = gu.contiguous()
    m, n = gu.shape[0], gu.shape[1] // 2
    _silu_mul[(triton.cdiv(m * n, 4096),)](gu, out, m, n, BLOCK=4096)
