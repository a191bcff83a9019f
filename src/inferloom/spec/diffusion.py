"""The spec of an image generation workload (``framework: diffusers``): what
defines the output (resolution, steps, guidance, scheduler, batch size,
prompts, seeds) and how much one timed run generates (docs/diffusers.md).
Part of :mod:`inferloom.spec`, which re-exports it."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator

from inferloom.spec.fields import _n, _Strict

__all__ = ["DiffusionSpec", "DEFAULT_IMAGE_PROMPTS"]

DEFAULT_IMAGE_PROMPTS: tuple[str, ...] = (
    "a photograph of an astronaut riding a horse",
    "a watercolor painting of a lighthouse at dawn",
    "a red fox in the snow, highly detailed",
    "an isometric city block at night, neon lights",
    "a bowl of ramen on a wooden table",
    "a portrait of an old sailor, oil on canvas",
    "a mountain lake reflecting pine trees",
    "a robot reading a book in a library",
)


class DiffusionSpec(_Strict):
    """One image workload. The same prompt and noise seed always give the same
    image under the stock configuration; every timed run draws fresh seeds."""

    height: int = _n(64, 16, 4096, "image height in pixels (a multiple of 16)")
    width: int = _n(64, 16, 4096, "image width in pixels (a multiple of 16)")
    steps: int = _n(4, 1, 1000, "denoising steps per image")
    guidance_scale: float = _n(5.0, 0.0, 100.0, "classifier-free guidance scale (above 1: CFG, two branches per step)")
    scheduler: str = Field("default", description="the pipeline family's scheduler: default, or for UNet pipelines "
                           "ddim, euler, dpm-solver, pndm; for SD3 and Flux flow-euler")
    batch_size: int = _n(1, 1, 256, "images per pipeline call")
    batches_per_run: int = _n(2, 1, 1000, "pipeline calls per timed run")
    prompts: list[str] = Field(default_factory=lambda: list(DEFAULT_IMAGE_PROMPTS), min_length=1,
                               description="the prompts, drawn from with each run's seed")
    prompts_file: str | None = Field(None, description="a JSONL file of {\"text\": ...} prompts (replaces prompts)")
    negative_prompt: str = Field("", description="the negative prompt of every image (CFG's other branch)")

    @field_validator("height", "width")
    @classmethod
    def _multiple(cls, v: int) -> int:
        if v % 16:
            raise ValueError(f"expected a multiple of 16 (the VAE and the patch size divide it), got {v}")
        return v

    @field_validator("prompts_file")
    @classmethod
    def _pf(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).is_file():
            raise ValueError(f"file {v} not found; expected an existing .jsonl file of {{\"text\": ...}}")
        return v

    @model_validator(mode="after")
    def _prompts(self) -> "DiffusionSpec":
        if any(not p.strip() for p in self.prompts):
            raise ValueError("diffusion.prompts: an empty prompt; expected non-empty texts")
        return self

    @property
    def images_per_run(self) -> int:
        return self.batch_size * self.batches_per_run
