"""The image generator's optional adapter hook (framework: diffusers), beside
the hooks in :mod:`inferloom.workloads.base` (whose ``OPTIONAL_HOOKS`` lists it too)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["ImageOutputs"]


@runtime_checkable
class ImageOutputs(Protocol):
    """An image generator: the quality contract compares its images with stock's.

    ``draw(seed, n)``: ``n`` items ``[prompt_index, noise_seed]`` drawn from
    ``seed`` (the quality sets' items; the same seed gives the same items).
    ``generate_images(handle, items)``: one image per item ``[prompt_index,
    noise_seed]`` through the configuration's real pipeline, returning float32
    CPU tensors ``{"latents": [n, C, h, w] (final), "trajectory": [n, steps,
    C, h, w] (the latents after each denoising step), "images": [n, H, W, 3]
    in [0, 1]}``; the same item gives the same initial noise under every
    configuration. With it, :mod:`inferloom.measure.image_quality` replaces
    the token-level contract (PSNR, SSIM, latent and per-step divergence)."""

    def draw(self, seed: int, n: int) -> list[list[int]]: ...

    def generate_images(self, handle: Any, items: list[list[int]]) -> dict[str, Any]: ...
