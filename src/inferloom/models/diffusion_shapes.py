"""What a kernel backend sees of an image workload, from the pipeline's configs alone (components built on
the ``meta`` device: no memory, no weights): the denoiser's batch and tokens, its heads, and its eager
RMSNorms (diffusers' ``RMSNorm`` with a weight and no bias: the q/k norms of ``qk_norm: rms_norm``, the
KERNEL phase's target, :mod:`inferloom.workloads.diffusers_ops`). :func:`diffusion_workload` is the
``diffusion`` part of :func:`~inferloom.kernels.base.workload_of`."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from inferloom.models.diffusion_presets import (DIFFUSION_PRESETS, build_denoiser, build_vae, preset_family,
                                               uses_cfg_batch)

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["eager_rmsnorms", "eager_rmsnorm_count", "diffusion_workload", "MAX_ROWS_CHECKED"]

MAX_ROWS_CHECKED = 1 << 18  # the correctness gate's float64 reference holds rows x head_dim


def eager_rmsnorms(module: Any) -> list[Any]:
    """diffusers' eager RMSNorm modules of ``module`` that have a weight and no bias."""
    from diffusers.models.normalization import RMSNorm

    return [m for m in module.modules()
            if isinstance(m, RMSNorm) and m.weight is not None and getattr(m, "bias", None) is None]


@functools.lru_cache(maxsize=16)
def eager_rmsnorm_count(model: str) -> int:
    """How many eager RMSNorm modules the denoiser of ``model`` has (built from its config on ``meta``)."""
    return len(eager_rmsnorms(build_denoiser(model, "meta")))


def diffusion_workload(spec: WorkloadSpec) -> dict[str, Any]:
    """See :func:`_workload` (cached: the KERNEL phase asks on every tick)."""
    d = spec.diffusion
    return dict(_workload(spec.model, d.height, d.width, d.batch_size, d.guidance_scale))


@functools.lru_cache(maxsize=32)
def _workload(model: str, height: int, width: int, batch_size: int, guidance_scale: float) -> dict[str, Any]:
    """The image workload as a kernel backend sees it: the denoiser's batch (doubled under CFG), its tokens
    per image (latent patches + text), heads and head dim, and how many eager RMSNorms it has. The q/k norm's
    rows: ``rms_rows`` = batch x heads x tokens, each ``head_dim`` wide."""
    family = preset_family(model)
    den = build_denoiser(model, "meta")
    c = den.config
    if family == "unet":
        heads = head_dim = tokens = 0
    else:
        heads, head_dim = int(c.num_attention_heads), int(c.attention_head_dim)
        f = 2 ** (len(build_vae(model, "meta").config.block_out_channels) - 1)
        patch = int(c.patch_size) * (2 if family == "flux" else 1)  # Flux packs 2x2 latents into one token
        txt = int((DIFFUSION_PRESETS.get(model) or {}).get("call", {}).get("max_sequence_length", 256))
        tokens = (height // f // patch) * (width // f // patch) + txt + (77 if family == "sd3" else 0)
    batch = batch_size * (2 if uses_cfg_batch(family, guidance_scale) else 1)
    return {"family": family, "batch": batch, "tokens": tokens, "heads": heads, "head_dim": head_dim,
            "rmsnorms": eager_rmsnorm_count(model), "rms_rows": min(batch * heads * tokens, MAX_ROWS_CHECKED)}
