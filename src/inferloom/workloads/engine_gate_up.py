"""The MLP's gate/up projection as one GEMM (the engine's ``mlp_kernel`` knob).

A Llama-style MLP (transformers' ``LlamaMLP`` and its copies: Mistral, Qwen2,
...) computes ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``: two GEMMs
over the same input, then SiLU and a multiply, each a kernel with its own
``[tokens, I]`` intermediate in memory. :func:`apply_mlp_kernel` rewrites
every such module in place:

* its ``gate_proj`` and ``up_proj`` are replaced by one bias-free
  ``gate_up_proj`` ``nn.Linear(H, 2I)`` whose weight is ``[Wg; Wu]``
  (``[2I, H]``, made once here). The two separate weights are released, not
  kept beside the fused one (on an 8B model they are 7.5 GB in bfloat16):
  layer by layer, so at the peak one layer's gate/up is allocated twice. On
  CUDA the allocator's cache of the released blocks (too small to hold a
  fused weight) is emptied at the end. Being a
  registered submodule, the fused weight follows ``.to()``, ``state_dict()``
  and ``parameters()`` like any other (under the key ``gate_up_proj.weight``).
* its ``forward`` is replaced on the instance (the class is never changed):

  - ``torch_gate_up``: ``gu = F.linear(x, W)`` (one GEMM), then
    ``down_proj(silu(gu[..., :I]) * gu[..., I:])``: transformers' numerics
    (each output element is the same dot product, rounded to the dtype,
    then SiLU and the product rounded separately), up to the GEMM's own
    blocking. CPU and CUDA.
  - ``triton_gate_up_silu``: ``down_proj(ops.gate_up_silu(x2d, W))``: the
    catalog's Triton GEMM over ``[Wg; Wu]`` with a SiLU·mul epilogue
    (``kernels/catalog/mlp.py``), neither ``[tokens, I]`` intermediate in
    memory, one rounding at the end, for up to ``TRITON_MAX_TOKENS`` tokens
    (decode steps: the sizes it is tuned and checked at); a larger call (a
    prefill) takes ``torch_gate_up``'s one cuBLAS GEMM over the same weight. Through the catalog's custom op
    (``catalog/ops.py``), so it is one opaque node in a compiled graph and a
    plain kernel launch for CUDA graphs. CUDA (the engine refuses it
    elsewhere; on a CPU it runs only under ``TRITON_INTERPRET=1``, for tests).

Both forwards use static shapes and no host synchronisation, so
``torch.compile(fullgraph=True)`` and CUDA graphs can trace them.

A module is a Llama-style MLP when it has ``gate_proj``, ``up_proj`` and
``down_proj``; it must then have bias-free ``nn.Linear`` gate/up projections
of one shape and a SiLU ``act_fn``, or :func:`apply_mlp_kernel` raises a
``ValueError`` naming the module and why (nothing is changed then).
"""

from __future__ import annotations

from typing import Any, Callable

from inferloom.kernels.catalog import triton_available
from inferloom.kernels.torch_ops import gate_up_silu_torch

__all__ = ["MLP_KERNELS", "apply_mlp_kernel", "gate_up_mlps", "fuse_gate_up"]

MLP_KERNELS = ("eager", "torch_gate_up", "triton_gate_up_silu")


def _is_silu(act: Any) -> bool:
    import torch

    # transformers' ACT2FN["silu"] is its own SiLUActivation (5.x) or torch's nn.SiLU
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"


def _why_not(mod: Any) -> str | None:
    """None when ``mod`` is a Llama-style MLP the rewrite handles, else why not."""
    import torch

    gate, up, down = mod.gate_proj, mod.up_proj, mod.down_proj
    for name, lin in (("gate_proj", gate), ("up_proj", up), ("down_proj", down)):
        if not isinstance(lin, torch.nn.Linear):
            return f"{name} is a {type(lin).__name__}, not an nn.Linear"
    for name, lin in (("gate_proj", gate), ("up_proj", up)):
        if lin.bias is not None:
            return f"{name} has a bias (the fused gate/up GEMM has none)"
    if gate.weight.shape != up.weight.shape:
        return f"gate_proj {tuple(gate.weight.shape)} and up_proj {tuple(up.weight.shape)} differ in shape"
    if gate.weight.dtype != up.weight.dtype or gate.weight.device != up.weight.device:
        return "gate_proj and up_proj weights differ in dtype or device"
    if not _is_silu(getattr(mod, "act_fn", None)):
        return f"act_fn is {type(getattr(mod, 'act_fn', None)).__name__}, not SiLU"
    return None


def gate_up_mlps(model: Any) -> list[tuple[str, Any]]:
    """``(name, module)`` of every Llama-style MLP of ``model``; ``ValueError``
    naming the first module that has gate/up/down projections the rewrite
    can't handle, or when there is none."""
    found = [(n, m) for n, m in model.named_modules()
             if all(hasattr(m, a) for a in ("gate_proj", "up_proj", "down_proj"))]
    if not found:
        raise ValueError(f"{type(model).__name__} has no Llama-style MLP module "
                         "(gate_proj, up_proj, down_proj and a SiLU act_fn)")
    for name, mod in found:
        why = _why_not(mod)
        if why is not None:
            raise ValueError(f"MLP module {name or '<root>'} ({type(mod).__name__}): {why}")
    return found


def fuse_gate_up(mod: Any) -> int:
    """Replace ``mod.gate_proj`` / ``mod.up_proj`` by one ``mod.gate_up_proj``
    over ``[Wg; Wu]`` and release the two; returns the intermediate size I."""
    import torch

    gate, up = mod.gate_proj, mod.up_proj
    inter, hidden = gate.weight.shape
    with torch.no_grad():
        w = torch.cat([gate.weight, up.weight], dim=0)
    fused = torch.nn.Linear(hidden, 2 * inter, bias=False, device="meta")
    fused.weight = torch.nn.Parameter(w, requires_grad=gate.weight.requires_grad)
    del mod.gate_proj, mod.up_proj
    mod.gate_up_proj = fused
    return int(inter)


def _torch_forward(mod: Any, inter: int) -> Callable[[Any], Any]:
    def forward(x: Any) -> Any:
        return mod.down_proj(gate_up_silu_torch(x, mod.gate_up_proj.weight, inter))

    return forward


# the Triton GEMM is tuned for decode-sized token counts; a prefill's many
# tokens go to cuBLAS over the same fused weight (the token count is static in
# a traced graph, so the branch is resolved at trace time)
TRITON_MAX_TOKENS = 256


def _triton_forward(mod: Any, inter: int) -> Callable[[Any], Any]:
    from inferloom.kernels.catalog import ops

    def forward(x: Any) -> Any:
        x2 = x.reshape(-1, x.shape[-1])
        if x2.shape[0] > TRITON_MAX_TOKENS:
            return mod.down_proj(gate_up_silu_torch(x, mod.gate_up_proj.weight, inter))
        y = ops.gate_up_silu(x2, mod.gate_up_proj.weight)
        return mod.down_proj(y.reshape(*x.shape[:-1], inter))

    return forward


def apply_mlp_kernel(model: Any, impl: str) -> str | None:
    """Rewrite ``model``'s MLPs for ``mlp_kernel=impl`` in place; a note, or None for ``eager``."""
    if impl == "eager":
        return None
    if impl not in MLP_KERNELS:
        raise ValueError(f"mlp_kernel={impl!r}: unknown implementation (one of {', '.join(MLP_KERNELS)})")
    mods = gate_up_mlps(model)  # every module checked before any is changed
    if impl == "triton_gate_up_silu":
        if not triton_available():
            raise ValueError("mlp_kernel=triton_gate_up_silu: triton is not installed")
        from inferloom.kernels.catalog import ops  # noqa: F401 - registers the custom ops before anything changes
    make = _torch_forward if impl == "torch_gate_up" else _triton_forward
    inters = set()
    for _, mod in mods:
        inter = fuse_gate_up(mod)
        mod.forward = make(mod, inter)
        inters.add(inter)
    _release_cached(model)
    what = "one GEMM + SiLU·mul" if impl == "torch_gate_up" else "Triton GEMM with a SiLU·mul epilogue"
    sizes = ", ".join(f"[{2 * i}, H]" for i in sorted(inters))
    return f"{impl}: {len(mods)} MLP modules, gate/up fused into one {sizes} weight each, {what}"


def _release_cached(model: Any) -> None:
    """Give the CUDA caching allocator's blocks of the released gate/up weights
    back (the fused weights are larger blocks, which they can't be reused for)."""
    import torch

    if any(p.is_cuda for p in model.parameters()) and torch.cuda.is_available():
        torch.cuda.empty_cache()
