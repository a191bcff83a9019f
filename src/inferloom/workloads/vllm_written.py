"""Kernels the LLM kernel author wrote, run inside a vLLM server: each a ``register_oot`` replacement in the
server's plugin overlay (``vllm_plugins``), switched on by the KERNEL-phase knob ``llm_kernel``.

The kernel library (:mod:`inferloom.kernels.written`) keeps what a written kernel is (its catalog entry, its
source, the sha256 that names it, the gates it passed); the framework descriptor's ``written_ops`` says which
entries a vLLM server takes (``elementwise`` -> ``silu_mul``, ``normalization`` -> ``add_rmsnorm``). Here a
written kernel becomes a replacement: the author's module as written, then a ``forward`` that calls its
``kernel`` exactly as the gates checked it:

* ``silu_mul`` replaces ``SiluAndMul``: ``kernel(gu, *, out)`` on the rows ``[tokens, 2d]``, into a fresh
  ``[tokens, d]``;
* ``add_rmsnorm`` replaces ``RMSNorm`` with the fused add vLLM's decoder layers call it with:
  ``kernel(x, residual, weight, eps, out=(normed, residual_out))``, ``residual_out`` (``x + residual``) the
  residual handed on; the first layer's call has no residual (``kernel(x, None, ...)``). The author is shown,
  and the gates check, both (``written.shown_shapes``: the decode and prefill shapes with the residual, the
  decode one without). A layer the kernel does not cover (``variance_size_override``, no weight) runs vLLM's
  own forward.

One plugin overlay per server carries every replacement: the ``kernel_plugin`` knob's and the written ones
(``vllm_kernel_overlays`` builds it from both knobs). Two replacements of one op can't both load, so a
configuration whose ``kernel_plugin`` and ``llm_kernel`` replace the same op is refused before its launch
(``vllm_kernel_overlays.plugin_refusal``, the adapter's cross-knob rule). The author's code runs in the server process, as a
transformers session runs it in its own: the role's warning (docs/llm.md) applies; ``verify --remeasure``
registers the session's kernels again only after their sha256 matched, and runs the fresh process sandboxed.
"""

from __future__ import annotations

from pathlib import Path

from inferloom.kernels import written, written_set
from inferloom.workloads.vllm_plugins import KernelReplacement

__all__ = ["OPS", "replacements", "replacement_of", "ops", "SILU_MUL_FORWARD", "RMSNORM_FORWARD"]

#: catalog entry -> the vLLM op its written kernel replaces
OPS: dict[str, str] = {"silu_mul": "SiluAndMul", "add_rmsnorm": "RMSNorm"}

SILU_MUL_FORWARD = '''

# ---- inferloom (workloads/vllm_written.py): vLLM's SiluAndMul over the written kernel above ----
import torch as _inferloom_torch


def forward(self, x):
    d = x.shape[-1] // 2
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = _inferloom_torch.empty((rows.shape[0], d), dtype=x.dtype, device=x.device)
    kernel(rows, out=out)
    return out.reshape(*x.shape[:-1], d)
'''

RMSNORM_FORWARD = '''

# ---- inferloom (workloads/vllm_written.py): vLLM's RMSNorm (with its fused residual add) over the kernel above ----
import torch as _inferloom_torch


def forward(self, x, residual=None):
    if self.variance_size_override is not None or not self.has_weight:
        return self.stock_forward(x, residual)
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    res = None if residual is None else residual.reshape(-1, residual.shape[-1]).contiguous()
    out = (_inferloom_torch.empty_like(rows), _inferloom_torch.empty_like(rows))
    kernel(rows, res, self.weight, self.variance_epsilon, out=out)
    normed = out[0].reshape(x.shape)
    return normed if residual is None else (normed, out[1].reshape(x.shape))
'''

_FORWARD = {"silu_mul": SILU_MUL_FORWARD, "add_rmsnorm": RMSNORM_FORWARD}


def replacements(value: str) -> list[KernelReplacement]:
    """The replacement of each written kernel ``value`` names (``none``: []); ``ValueError`` for one not
    registered in this process (a resumed session and ``verify --remeasure`` register the session's first) or
    whose entry a vLLM server doesn't take."""
    out = []
    for member in written_set.members(value):
        entry, path = written.lookup(member)
        r = replacement_of(entry, member, path)
        if r is None:
            raise ValueError(f"{written.KNOB}={member}: a written {entry} kernel has no vLLM op to replace "
                             f"(the server takes {', '.join(OPS)})")
        out.append(r)
    return out


def replacement_of(entry: str, name: str, path: Path) -> KernelReplacement | None:
    """The replacement a written ``entry`` kernel ``name`` (its module at ``path``, registered or not: the
    KERNEL phase gates it before registering it) becomes in the server; None for an entry it doesn't take."""
    if entry not in OPS:
        return None
    return KernelReplacement(OPS[entry], Path(path).read_text() + _FORWARD[entry], name=name)


def ops(value: str) -> set[str]:
    """The vLLM ops the written kernels ``value`` names replace."""
    return {OPS[e] for e in (written.entry_of(m) for m in written_set.members(value)) if e in OPS}
