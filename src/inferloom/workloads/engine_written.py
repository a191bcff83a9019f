"""Written kernels delivered into the engines: the ``llm_kernel`` knob and the rewrite of a model's modules.

The kernels themselves (the registry of those whose gates passed, a kernel's identity, what it replaces and needs)
are the kernel library's (:mod:`inferloom.kernels.written`, combinations :mod:`inferloom.kernels.written_set`);
this module is the engines' switch for them, as :mod:`inferloom.workloads.engine_kernels` is for the catalog's:

* :func:`knob`: the ``llm_kernel`` knob with the kernels registered now (the transformers and diffusers engines
  add it to their knob space in a session with the LLM kernel author).
* :func:`apply_written_kernel`: the transformers engine's model rewritten to call one written kernel (the MLP
  ones fuse the gate and up weights as ``mlp_kernel=torch_gate_up`` does,
  :mod:`inferloom.workloads.engine_gate_up`; ``add_rmsnorm`` replaces every Llama-style RMSNorm's forward;
  ``decode_attention`` is registered on the attention path as ``attention_kernel`` registers the catalog's,
  :func:`inferloom.workloads.engine_attention.register`); :func:`apply` every member of a combination.
* :func:`apply_written_norms`: RMSNorm modules the engine found (the diffusers denoiser's) made to call a written
  ``add_rmsnorm`` kernel; :func:`apply_norms` every member of a combination.
"""

from __future__ import annotations

from typing import Any, Callable

from inferloom.kernels.written import KNOB, import_kernel, lookup, registered
from inferloom.kernels.written_set import members, overlap
from inferloom.workloads.base import Knob
from inferloom.workloads.engine_attention import register as register_attention
from inferloom.workloads.engine_gate_up import fuse_gate_up, gate_up_mlps

__all__ = ["knob", "apply_written_kernel", "apply_written_norms", "apply", "apply_norms"]


def knob() -> Knob:
    """The ``llm_kernel`` knob with the kernels registered now."""
    return Knob(KNOB, "choice", "none",
                "a kernel the LLM kernel author wrote that passed the guards and the kernel gates (KERNEL phase): "
                "none, <catalog entry>-<source sha256>, or several of them that rewrite different modules joined "
                "by +; see kernels/written.py and kernels/written_set.py",
                choices=("none", *registered()), changes_numerics=True, phase="KERNEL")


def _forward(mod: Any, inter: int, entry: str, fn: Callable[..., Any]) -> Callable[[Any], Any]:
    import torch
    import torch.nn.functional as F

    def forward(x: Any) -> Any:
        x2 = x.reshape(-1, x.shape[-1])
        out = torch.empty((x2.shape[0], inter), dtype=x.dtype, device=x.device)
        if entry == "gate_up_silu":
            fn(x2, mod.gate_up_proj.weight, out=out)
        else:
            fn(F.linear(x2, mod.gate_up_proj.weight).contiguous(), out=out)
        return mod.down_proj(out.reshape(*x.shape[:-1], inter))

    return forward


def apply_written_kernel(model: Any, value: str) -> str:
    """Rewrite ``model``'s MLPs to call the written kernel ``value``; a note. ``ValueError`` for
    a value not registered in this process or a model without Llama-style MLPs."""
    entry, path = lookup(value)
    fn = import_kernel(path)
    if entry == "add_rmsnorm":
        return _apply_norm(model, value)
    if entry == "decode_attention":
        return _apply_attention(model, value, fn)
    mods = gate_up_mlps(model)  # every module checked before any is changed
    for _, mod in mods:
        inter = fuse_gate_up(mod)
        mod.forward = _forward(mod, inter, entry, fn)
    return f"{value}: {len(mods)} MLP modules call the written {entry} kernel ({path.name})"


def _norm_forward(mod: Any, fn: Callable[..., Any], eps: float) -> Callable[[Any], Any]:
    import torch

    def forward(hidden_states: Any) -> Any:
        x2 = hidden_states.reshape(-1, hidden_states.shape[-1]).contiguous()
        out = (torch.empty_like(x2), torch.empty_like(x2))
        fn(x2, None, mod.weight, eps, out=out)
        return out[0].reshape(hidden_states.shape)

    return forward


def apply_written_norms(mods: list[Any], value: str, eps_attr: str) -> str:
    """Make every RMSNorm module of ``mods`` (its epsilon in ``eps_attr``) call the written ``add_rmsnorm``
    kernel ``value`` on its rows; a note. ``ValueError`` for a value not registered here, another entry's
    kernel, or no module."""
    entry, path = lookup(value)
    if entry != "add_rmsnorm":
        raise ValueError(f"{KNOB}={value}: a written {entry} kernel; only add_rmsnorm rewrites RMSNorm modules")
    if not mods:
        raise ValueError(f"{KNOB}={value}: the model has no RMSNorm module to replace")
    fn = import_kernel(path)
    for m in mods:
        m.forward = _norm_forward(m, fn, float(getattr(m, eps_attr)))
    return f"{value}: {len(mods)} RMSNorm modules call the written add_rmsnorm kernel ({path.name})"


def _apply_norm(model: Any, value: str) -> str:
    mods = [m for m in model.modules()
            if type(m).__name__.endswith("RMSNorm") and hasattr(m, "weight") and hasattr(m, "variance_epsilon")]
    return apply_written_norms(mods, value, "variance_epsilon")


def _decode(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The engine's decode function (:data:`inferloom.workloads.engine_attention.DECODE_IMPLS`' signature) over a
    written ``decode_attention`` kernel: int32 ``seq_lens``/``starts`` as the gates checked it, the default scale."""
    import torch

    def decode(query: Any, key: Any, value: Any, start: Any, end: Any, scale: float) -> Any:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        fn(query, key, value, end.to(torch.int32), start.to(torch.int32), None, out=out)
        return out

    return decode


def _apply_attention(model: Any, value: str, fn: Callable[..., Any]) -> str:
    """Register the written decode attention kernel on the attention path as ``attention_kernel`` registers the
    catalog's (:func:`inferloom.workloads.engine_attention.register`) and set it as the model's implementation."""
    mods = [m for m in model.modules() if hasattr(m, "scaling") and hasattr(m, "head_dim")]
    if not mods:
        raise ValueError(f"{KNOB}={value}: the model has no attention module (with scaling and head_dim) to switch")
    odd = [m for m in mods if abs(float(m.scaling) - float(m.head_dim) ** -0.5) > 1e-6 * float(m.head_dim) ** -0.5]
    if odd:  # the gates call the kernel with scale=None (1/sqrt(head_dim)); nothing checked another scale
        raise ValueError(f"{KNOB}={value}: the model's attention scales by {float(odd[0].scaling):.6g}, not "
                         f"1/sqrt(head_dim); the written kernel was checked at the default scale only")
    name = register_attention(value, _decode(fn))
    model.set_attn_implementation(name)
    return f"{value}: decode steps of {len(mods)} attention modules call the written decode_attention kernel " \
           f"({lookup(value)[1].name}) through {name}, prefill through sdpa"


def apply(model: Any, value: str) -> str:
    """Rewrite ``model`` with every written kernel ``value`` names (the transformers engine); the notes, one per
    member. ``ValueError`` as :func:`apply_written_kernel`, or members that overlap."""
    why = overlap(value) if len(members(value)) > 1 else None
    if why:
        raise ValueError(f"{KNOB}={value}: {why}")
    return "; ".join(apply_written_kernel(model, m) for m in members(value))


def apply_norms(mods: list[Any], value: str, eps_attr: str) -> str:
    """:func:`apply_written_norms` for every member of ``value`` (the diffusers engine: only ``add_rmsnorm``
    members, and no two of them)."""
    why = overlap(value) if len(members(value)) > 1 else None
    if why:
        raise ValueError(f"{KNOB}={value}: {why}")
    return "; ".join(apply_written_norms(mods, m, eps_attr) for m in members(value))
