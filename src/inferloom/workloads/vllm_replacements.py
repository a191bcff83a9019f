"""Kernel replacements for vLLM's custom ops, as sources a plugin overlay carries (``vllm_plugins``).

A replacement's source is self-contained: it runs in the server's environment, which has torch and vLLM but
not inferloom. ``forward(self, x, residual=None)`` follows vLLM 0.32's ``RMSNorm.forward_native``: without
a residual it returns the normalised ``x``; with one, ``(normalised x + residual, x + residual)``, the
second rounded to the input dtype; a layer it does not cover (``variance_size_override``, no weight) goes
to ``self.stock_forward``.

* :func:`torch_rmsnorm`: ``torch.nn.functional.rms_norm`` (one ATen kernel) over float32 in place of
  vLLM's native composition (``pow``, ``mean``, ``rsqrt``, ``mul``: four kernels and their float32
  intermediates), the weight applied after the cast back to its dtype, as vLLM does. On CPU vLLM's stock
  RMSNorm is that native composition (``kernel_config.ir_op_priority``: ``rms_norm=['native']``).
* :func:`torch_silu_mul`: vLLM's ``SiluAndMul`` (``forward(self, x)``: ``x`` ``[..., 2d]`` -> ``[..., d]``)
  as ``F.silu(gate)`` then an in-place ``mul_(up)`` into that same buffer: one ``[..., d]`` intermediate
  instead of two, vLLM's rounding order exactly (the SiLU rounded to the dtype, then the product rounded).
  On x86 CPUs vLLM's stock ``SiluAndMul`` is ``forward_native`` (``F.silu(x[..., :d]) * x[..., d:]``); on
  CUDA it is the ``_C.silu_and_mul`` kernel, which the replacement would be racing instead.

The catalog's Triton kernels as replacements: :mod:`~inferloom.workloads.vllm_triton_replacements`.
"""

from __future__ import annotations

from inferloom.workloads.vllm_plugins import KernelReplacement

__all__ = ["TORCH_RMSNORM_SOURCE", "torch_rmsnorm", "TORCH_SILU_MUL_SOURCE", "torch_silu_mul"]

TORCH_RMSNORM_SOURCE = '''"""RMSNorm through torch.nn.functional.rms_norm (inferloom vllm_replacements.torch_rmsnorm)."""
import torch
import torch.nn.functional as F


def forward(self, x, residual=None):
    if self.variance_size_override is not None or not self.has_weight:
        return self.stock_forward(x, residual)
    dtype = x.dtype
    h = x.to(torch.float32)
    if residual is not None:
        h = h + residual.to(torch.float32)
        residual = h.to(dtype)
    out = F.rms_norm(h, (h.shape[-1],), eps=self.variance_epsilon)
    out = (out.to(self.weight.dtype) * self.weight).to(dtype)
    return out if residual is None else (out, residual)
'''


def torch_rmsnorm() -> KernelReplacement:
    """RMSNorm replaced by :data:`TORCH_RMSNORM_SOURCE`."""
    return KernelReplacement("RMSNorm", TORCH_RMSNORM_SOURCE, name="torch_rmsnorm")


TORCH_SILU_MUL_SOURCE = '''"""SiluAndMul with the SiLU's buffer reused for the product (inferloom vllm_replacements.torch_silu_mul)."""
import torch.nn.functional as F


def forward(self, x):
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]).mul_(x[..., d:])
'''


def torch_silu_mul() -> KernelReplacement:
    """SiluAndMul replaced by :data:`TORCH_SILU_MUL_SOURCE`."""
    return KernelReplacement("SiluAndMul", TORCH_SILU_MUL_SOURCE, name="torch_silu_mul")
