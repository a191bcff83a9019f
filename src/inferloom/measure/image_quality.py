"""The quality contract for images (``framework: diffusers``).

Reference = the stock configuration's own images on a fixed set of items
``[prompt_index, noise_seed]`` (an eval set and a held-out set, drawn from the
spec's seed with the same offsets as the text contract's prompt sets). The
candidate generates the same items from the same initial noise; per image:

* ``psnr_db``: PSNR of the decoded image against stock's (scikit-image,
  data range 1); the contract needs ``min_psnr_db`` >= ``quality.min_psnr_db``.
  Identical images (MSE 0) are reported as :data:`PSNR_IDENTICAL_DB`.
* ``ssim``: SSIM against stock's (scikit-image, over the colour channels);
  ``min_ssim`` >= ``quality.min_ssim``.
* ``latent_rel_err``: relative L2 error of the final latent against stock's;
  ``max_latent_rel_err`` <= ``quality.max_latent_rel_err``.
* per-step latent divergence: the relative L2 error of the latents after each
  denoising step (reported, ``max_step_rel_err`` and the curve in the
  details: where a candidate's trajectory leaves stock's).

A candidate with a non-finite pixel or latent fails every check. The
thresholds' calibration (stock against itself, legitimate numerics changes,
deliberately broken candidates) is in docs/quality.md, made by
``benchmarks/diffusers_quality_calibration.py``. Pure functions except
:func:`capture_image_reference`, which calls the adapter's probe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["PSNR_IDENTICAL_DB", "ImageReference", "image_sets", "psnr_ssim", "compare_images", "image_checks",
           "capture_image_reference"]

PSNR_IDENTICAL_DB = 100.0  # reported for identical images (PSNR is infinite; JSON has no infinity)
NONFINITE_REL_ERR = 1e6  # reported when a candidate's latent is not finite


@dataclass
class ImageReference:
    set_name: str
    prompts: list[list[int]]  # the items [prompt_index, noise_seed]
    latents: Any  # float32 [n, C, h, w]
    trajectory: Any  # float32 [n, steps, C, h, w]
    images: Any  # float32 [n, H, W, 3] in [0, 1]


def image_sets(adapter: Any, seed: int, sizes: Mapping[str, tuple[int, int]]) -> dict[str, list[list[int]]]:
    """``{name: items}`` for each ``name: (n, seed_offset)``, drawn by the adapter from ``seed + offset``."""
    return {name: adapter.draw(seed + off, n) for name, (n, off) in sizes.items()}


def psnr_ssim(ref: Any, cand: Any) -> tuple[float, float]:
    """PSNR (dB, capped at PSNR_IDENTICAL_DB) and SSIM of one [H, W, 3] image pair in [0, 1]."""
    import numpy as np
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity

    r = np.asarray(ref, dtype=np.float64)
    c = np.asarray(cand, dtype=np.float64)
    if not np.isfinite(c).all():
        return 0.0, -1.0
    mse = float(np.mean((r - c) ** 2))
    psnr = PSNR_IDENTICAL_DB if mse == 0.0 else min(PSNR_IDENTICAL_DB, float(peak_signal_noise_ratio(r, c, data_range=1.0)))
    side = min(r.shape[0], r.shape[1])
    win = min(7, side if side % 2 else side - 1)
    ssim = float(structural_similarity(r, c, data_range=1.0, channel_axis=-1, win_size=win))
    return psnr, ssim


def _rel(ref: Any, cand: Any) -> Any:
    """Per-row relative L2 error over all but the first dimension (float64)."""
    import torch

    r = ref.to(torch.float64).flatten(1)
    c = cand.to(torch.float64).flatten(1)
    err = (c - r).norm(dim=1) / r.norm(dim=1).clamp_min(1e-12)
    return torch.where(torch.isfinite(err), err, torch.full_like(err, NONFINITE_REL_ERR))


def compare_images(ref: ImageReference, out: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, Any]]:
    """Pure: the contract's values (floats) and details (per image, per step) of a candidate's outputs."""
    n = len(ref.prompts)
    for key, want in (("images", ref.images), ("latents", ref.latents), ("trajectory", ref.trajectory)):
        if tuple(out[key].shape) != tuple(want.shape):
            raise ValueError(f"image quality: candidate {key} shape {tuple(out[key].shape)}, stock's "
                             f"{tuple(want.shape)}; the same items must give the same shapes")
    pairs = [psnr_ssim(ref.images[i].numpy(), out["images"][i].numpy()) for i in range(n)]
    psnr = [p for p, _ in pairs]
    ssim = [s for _, s in pairs]
    lat = _rel(ref.latents, out["latents"]).tolist()
    steps = ref.trajectory.shape[1]
    per_step = [max(_rel(ref.trajectory[:, s], out["trajectory"][:, s]).tolist()) for s in range(steps)]
    values = {
        "min_psnr_db": min(psnr), "mean_psnr_db": sum(psnr) / n, "min_ssim": min(ssim), "mean_ssim": sum(ssim) / n,
        "max_latent_rel_err": max(lat), "max_step_rel_err": max(per_step),
        "identical_images": float(sum(p == PSNR_IDENTICAL_DB for p in psnr)),
    }
    details = {"psnr_db": psnr, "ssim": ssim, "latent_rel_err": lat, "step_rel_err": per_step,
               "psnr_identical_db": PSNR_IDENTICAL_DB}
    return values, details


def image_checks(values: Mapping[str, float], th: Any) -> tuple[tuple[str, bool, str, float], ...]:
    """The contract's checks in order: (name, passed, operator, limit)."""
    return (
        ("min_psnr_db", values["min_psnr_db"] >= th.min_psnr_db, ">=", th.min_psnr_db),
        ("min_ssim", values["min_ssim"] >= th.min_ssim, ">=", th.min_ssim),
        ("max_latent_rel_err", values["max_latent_rel_err"] <= th.max_latent_rel_err, "<=", th.max_latent_rel_err),
    )


def capture_image_reference(adapter: Any, handle: Any, set_name: str, items: list[list[int]]) -> ImageReference:
    """Stock's images, final latents and per-step latents of ``items``."""
    out = adapter.generate_images(handle, items)
    return ImageReference(set_name, [list(i) for i in items], out["latents"], out["trajectory"], out["images"])
