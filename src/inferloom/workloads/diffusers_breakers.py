"""Deliberately broken candidates of a diffusers pipeline, to calibrate the
image quality contract: every one must fail it, while stock against itself
and legitimate numerics changes (dtype, fused or forced kernels) pass.

* ``wrong_timesteps``: the denoiser is given the timestep on the wrong
  scale (divided by 1000: a sigma in [0, 1] where the model expects t in
  [0, 1000], a common scheduler-integration bug).
* ``dropped_block``: one transformer block (MMDiT) or the UNet's middle
  attention is skipped (a layer lost in a rewrite).
* ``int4_noise``: every denoiser weight matrix rounded to 4 bits per tensor
  (heavy quantization noise).
* ``int8_noise``: the same at 8 bits: mild quantization, reported to place
  the thresholds (not required to fail).

:class:`BreakableEngine` is the diffusers engine with one more knob,
``breakage``, that applies one of them after the pipeline is built (for the
calibration script and the tests; never offered by the default engine).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from inferloom.workloads.base import Knob
from inferloom.workloads.diffusers_engine import DiffusersEngine, DiffusersHandle
from inferloom.workloads.diffusers_knobs import denoiser_of

__all__ = ["BREAKERS", "MUST_FAIL", "BreakableEngine"]


def _wrong_timesteps(pipe: Any) -> None:
    den = denoiser_of(pipe)
    forward = den.forward

    def shifted(*args: Any, **kwargs: Any) -> Any:
        if "timestep" in kwargs:
            kwargs["timestep"] = kwargs["timestep"] / 1000.0
        else:
            args = (args[0], args[1] / 1000.0, *args[2:])
        return forward(*args, **kwargs)

    den.forward = shifted


def _dropped_block(pipe: Any) -> None:
    den = denoiser_of(pipe)
    blocks = getattr(den, "transformer_blocks", None)
    if blocks is not None:
        del blocks[max(0, len(blocks) // 2 - 1)]  # a middle block (the last one is context-pre-only)
        return
    attn = den.mid_block.attentions[0]
    attn.forward = lambda hidden_states, *a, **k: (hidden_states,)


def _quantize(bits: int) -> Callable[[Any], None]:
    levels = 2 ** (bits - 1) - 1

    def apply(pipe: Any) -> None:
        with torch.no_grad():
            for p in denoiser_of(pipe).parameters():
                if p.dim() >= 2:
                    scale = p.abs().max().clamp_min(1e-12) / levels
                    p.copy_(torch.round(p / scale) * scale)

    return apply


BREAKERS: dict[str, Callable[[Any], None]] = {
    "wrong_timesteps": _wrong_timesteps,
    "dropped_block": _dropped_block,
    "int4_noise": _quantize(4),
    "int8_noise": _quantize(8),
}
MUST_FAIL: tuple[str, ...] = ("wrong_timesteps", "dropped_block", "int4_noise")


class BreakableEngine(DiffusersEngine):
    """The diffusers engine plus a ``breakage`` knob (``none`` or a :data:`BREAKERS` name)."""

    def knob_space(self) -> list[Knob]:
        return super().knob_space() + [
            Knob("breakage", "choice", "none", "a deliberately broken candidate (calibration only)",
                 choices=("none", *BREAKERS), changes_numerics=True)]

    def prepare(self, config: Mapping[str, Any]) -> DiffusersHandle:
        h = super().prepare(config)
        if h.config["breakage"] != "none":
            BREAKERS[h.config["breakage"]](h.pipe)
            h.notes["breakage"] = h.config["breakage"]
        return h
