"""Costs and roofline of an image workload, per denoising step.

FLOPs come from the model's shape: the denoiser (and, per image, the VAE
decoder) is built on the ``meta`` device (no memory, no weights) and one
forward at the workload's shape (batch, doubled under classifier-free
guidance; latent size; text length) runs under
``torch.utils.flop_counter.FlopCounterMode``, which counts every matmul,
convolution and attention exactly. Bytes are the weights each phase reads
once (parameters x dtype bytes): activation traffic is not counted, so the
bandwidth floor is a lower bound.

:func:`image_roofline` turns the device's ceilings into floors: a step cannot
take less than ``max(bytes / bandwidth, FLOPs / matmul rate)``; a pipeline call
of ``batch`` images takes at least ``steps x step floor + decode floor`` (the
text encoders, run once per prompt, are left out), so the ceiling is
``batch / that`` images/s, and ``fraction`` is the measured images/s over it.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping

from inferloom.models.diffusion_presets import DIFFUSION_PRESETS, build_denoiser, build_vae, preset_family

__all__ = ["diffusion_costs", "image_roofline"]


def _count(fn: Any) -> int:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        fn()
    return int(counter.get_total_flops())


def _params(module: Any) -> int:
    return sum(p.numel() for p in module.parameters())


@functools.lru_cache(maxsize=16)
def diffusion_costs(model: str, height: int, width: int, batch: int, cfg: bool, dtype_bytes: int) -> dict[str, Any]:
    """FLOPs and weight bytes of one denoising step (``step``) and one VAE decode (``decode``) of ``batch`` images."""
    import torch

    family = preset_family(model)
    den = build_denoiser(model, "meta")
    vae = build_vae(model, "meta")
    f = 2 ** (len(vae.config.block_out_channels) - 1)
    b2 = batch * (2 if cfg else 1)
    h, w = height // f, width // f
    meta = {"device": "meta"}
    c = den.config
    lat = torch.empty(b2, c.in_channels, h, w, **meta)
    if family == "unet":
        text = torch.empty(b2, 77, c.cross_attention_dim, **meta)
        step_flops = _count(lambda: den(lat, torch.tensor(500, **meta), encoder_hidden_states=text, return_dict=False))
    elif family == "flux":  # packed 2x2 latent patches; T5's tokens only (CLIP gives the pooled vector)
        txt = int((DIFFUSION_PRESETS.get(model) or {}).get("call", {}).get("max_sequence_length", 512))
        seq = (h // 2) * (w // 2)
        guidance = torch.empty(b2, **meta) if c.guidance_embeds else None
        step_flops = _count(lambda: den(
            hidden_states=torch.empty(b2, seq, c.in_channels, **meta),
            encoder_hidden_states=torch.empty(b2, txt, c.joint_attention_dim, **meta),
            pooled_projections=torch.empty(b2, c.pooled_projection_dim, **meta), timestep=torch.empty(b2, **meta),
            img_ids=torch.zeros(seq, 3, **meta), txt_ids=torch.zeros(txt, 3, **meta), guidance=guidance,
            return_dict=False))
    else:
        extra = int((DIFFUSION_PRESETS.get(model) or {}).get("call", {}).get("max_sequence_length", 256))
        text = torch.empty(b2, 77 + extra, c.joint_attention_dim, **meta)
        pooled = torch.empty(b2, c.pooled_projection_dim, **meta)
        step_flops = _count(lambda: den(hidden_states=lat, encoder_hidden_states=text, pooled_projections=pooled,
                                        timestep=torch.empty(b2, **meta), return_dict=False))
    z = torch.empty(batch, vae.config.latent_channels, h, w, **meta)
    decode_flops = _count(lambda: vae.decode(z, return_dict=False))
    dec_params = _params(vae.decoder) + (_params(vae.post_quant_conv) if vae.post_quant_conv is not None else 0)
    return {
        "model": model, "family": family, "height": height, "width": width, "batch": batch, "cfg": cfg,
        "dtype_bytes": dtype_bytes, "denoiser_params": _params(den), "decoder_params": dec_params,
        "step": {"flops": step_flops, "bytes": _params(den) * dtype_bytes},
        "decode": {"flops": decode_flops, "bytes": dec_params * dtype_bytes},
        "bytes_note": "weights read once per phase; activation traffic not counted (a lower bound)",
    }


def _floors(phase: Mapping[str, Any], bw: float, peak: float) -> dict[str, Any]:
    t_bw, t_cmp = phase["bytes"] / bw, phase["flops"] / peak
    return {"bytes": phase["bytes"], "flops": phase["flops"], "bandwidth_s": t_bw, "compute_s": t_cmp,
            "floor_s": max(t_bw, t_cmp), "bound": "memory" if t_bw >= t_cmp else "compute"}


def image_roofline(ceilings: Mapping[str, Any], costs: Mapping[str, Any], steps: int,
                   measured_images_per_s: float | None, *, tolerance: float = 0.02) -> dict[str, Any]:
    """Floors of one pipeline call (``steps`` denoising steps and a decode of ``costs['batch']`` images), the
    ceiling in images/s and where ``measured_images_per_s`` sits under it."""
    bw = float(ceilings["memory_bandwidth_bytes_per_s"])
    peak = float(ceilings["matmul_flops_per_s"])
    if not (bw > 0 and peak > 0 and math.isfinite(bw) and math.isfinite(peak)):
        raise ValueError("image roofline: ceilings must be positive and finite")
    if steps < 1:
        raise ValueError(f"image roofline: steps={steps}, expected >= 1")
    step, dec = _floors(costs["step"], bw, peak), _floors(costs["decode"], bw, peak)
    floor_s = steps * step["floor_s"] + dec["floor_s"]
    ceiling = costs["batch"] / floor_s
    out: dict[str, Any] = {
        "ceilings": {"memory_bandwidth_bytes_per_s": bw, "matmul_flops_per_s": peak,
                     "device_name": ceilings.get("device_name")},
        "unit": "images/s", "batch": costs["batch"], "steps": steps, "cfg": costs["cfg"],
        "height": costs["height"], "width": costs["width"], "denoise_step": step, "decode": dec,
        "floor_s": floor_s, "ceiling_images_per_s": ceiling, "ceiling_tok_per_s": ceiling,
        "step_share_of_floor": steps * step["floor_s"] / floor_s, "measured_images_per_s": None,
        "fraction": None, "headroom": None, "suspect": False, "tolerance": tolerance,
        "bytes_note": costs.get("bytes_note"),
    }
    if measured_images_per_s is not None:
        meas = float(measured_images_per_s)
        if not (meas > 0 and math.isfinite(meas)):
            raise ValueError(f"image roofline: measured_images_per_s={measured_images_per_s!r}, expected a positive number")
        frac = meas / ceiling
        out.update(measured_images_per_s=meas, fraction=frac, headroom=ceiling / meas, suspect=frac > 1 + tolerance)
        if out["suspect"]:
            out["reason"] = f"measured {meas:.4g} images/s is {frac:.2f}x the roofline ceiling {ceiling:.4g} images/s"
    return out
