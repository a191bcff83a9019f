"""The diffusers engine's KERNEL-phase switch and what a kernel backend sees of an image workload.

``rmsnorm_impl`` replaces the ``forward`` of every eager RMSNorm of the
denoiser (diffusers' ``RMSNorm`` with a weight and no bias: the DiT's q/k
norms, ``qk_norm: rms_norm`` as in SD3.5; upcast, pow, mean, rsqrt, mul,
cast, weight: five or more kernels) on the instance:

* ``eager``: untouched.
* ``torch_fused``: :func:`torch.nn.functional.rms_norm` in float32, cast
  back, then the weight (diffusers' order; one fused kernel where torch has it).
* ``triton``: the catalog's RMSNorm kernel (``kernels/catalog/rmsnorm.py``,
  entry ``add_rmsnorm`` without a residual), CUDA only.

``llm_kernel`` (only in a session with the LLM kernel author): a written
``add_rmsnorm`` kernel whose gates passed, in the same modules, in place of
``rmsnorm_impl`` (:func:`inferloom.workloads.engine_written.apply_written_norms`); a
combination of written kernels (:mod:`inferloom.kernels.written_set`) is
refused unless every member is an ``add_rmsnorm`` one (and two never are: they
rewrite the same modules).

``torch.nn.RMSNorm`` (Flux's q/k norms) is left alone: it already calls the
fused op. :func:`~inferloom.models.diffusion_shapes.eager_rmsnorm_count`
counts the replaceable modules from the denoiser's config on the ``meta``
device, so the knob's rule (:func:`rmsnorm_rule`) is known before anything is
built.
"""

from __future__ import annotations

from typing import Any, Mapping

from inferloom.kernels.torch_ops import fused_rmsnorm
from inferloom.kernels.written import entry_of
from inferloom.kernels.written_set import members, overlap
from inferloom.models.diffusion_shapes import eager_rmsnorm_count, eager_rmsnorms

__all__ = ["apply_rmsnorm_impl", "rmsnorm_rule", "written_rule", "RMSNORM_IMPLS"]

RMSNORM_IMPLS = ("eager", "torch_fused", "triton")


def apply_rmsnorm_impl(denoiser: Any, impl: str) -> str:
    """Replace the eager RMSNorms' ``forward`` by ``impl``; returns a note (raises ValueError without any)."""
    mods = eager_rmsnorms(denoiser)
    if not mods:
        raise ValueError(f"rmsnorm_impl={impl}: the denoiser has no eager RMSNorm to replace")
    for m in mods:
        if impl == "torch_fused":
            m.forward = (lambda mod: (lambda hidden_states: fused_rmsnorm(hidden_states, mod.weight, mod.eps)))(m)
        elif impl == "triton":
            from inferloom.kernels.catalog.rmsnorm import fused_add_rmsnorm

            m.forward = (lambda mod: (lambda hidden_states: fused_add_rmsnorm(
                hidden_states.contiguous(), None, mod.weight, mod.eps)[0]))(m)
        else:
            raise ValueError(f"rmsnorm_impl={impl!r}: unknown implementation; expected one of {RMSNORM_IMPLS}")
    return f"{impl}: {len(mods)} RMSNorm modules of the denoiser"


def rmsnorm_rule(cfg: Mapping[str, Any], model: str, device: str) -> str | None:
    """Why ``rmsnorm_impl`` cannot apply, else None."""
    impl = cfg.get("rmsnorm_impl", "eager")
    if impl == "eager":
        return None
    if impl == "triton" and device != "cuda":
        return f"triton is the catalog's CUDA kernel; device is {device}"
    if eager_rmsnorm_count(model) == 0:
        return f"{impl}: the denoiser has no eager RMSNorm to replace (no q/k RMSNorm in its config)"
    return None


def written_rule(cfg: Mapping[str, Any], model: str) -> str | None:
    """Why ``llm_kernel`` (a written RMSNorm kernel) cannot apply, else None."""
    value = str(cfg.get("llm_kernel", "none"))
    if value == "none":
        return None
    ms = members(value)
    others = [m for m in ms if entry_of(m) != "add_rmsnorm"]
    if others:  # a single kernel's refusal reads as before; a combination's names its members
        return f"{value}: only a written add_rmsnorm kernel has a switch in the diffusers engine" + (
            f" ({', '.join(others)} is not one)" if len(ms) > 1 else "")
    if len(ms) > 1:
        return f"{value}: {overlap(value) or 'more than one written kernel for the same RMSNorms'}"
    if cfg.get("rmsnorm_impl", "eager") != "eager":
        return f"the written kernel rewrites the RMSNorms itself; rmsnorm_impl is {cfg['rmsnorm_impl']}"
    if eager_rmsnorm_count(model) == 0:
        return f"{value}: the denoiser has no eager RMSNorm to replace (no q/k RMSNorm in its config)"
    return None
