"""What the server engines' MoE knobs share: whether the model has MoE layers at all.

A knob of the experts' kernels (vLLM's ``moe_backend``, SGLang's ``moe_runner_backend``) means nothing for a
dense model: its adapter drops it with :func:`moe_only_refusal`'s reason, read from the model directory's
``config.json`` (:func:`config_json`), as ``vllm_moe_configs.moe_shape`` reads an MoE shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping

from inferloom.workloads.base import Knob
from inferloom.workloads.vllm_moe_configs import moe_shape

__all__ = ["config_json", "moe_only_refusal", "drop_moe_only"]


def config_json(model_dir: str | Path) -> dict[str, Any] | None:
    """The model directory's ``config.json``, or None when it can't be read."""
    try:
        out = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return out if isinstance(out, dict) else None


def moe_only_refusal(knob: str, hf_config: Mapping[str, Any] | None) -> str | None:
    """Why a knob of MoE layers does not apply to this model (its config unreadable, or a dense model), or None."""
    if hf_config is None:
        return f"{knob}: the model's config.json can't be read, so whether it has MoE layers is unknown"
    if moe_shape(hf_config) is None:
        return f"{knob}: the model has no MoE layers (a dense model)"
    return None


def drop_moe_only(kept: Iterable[Knob], dropped: Mapping[str, str], whys: Mapping[str, str | None],
                  ) -> tuple[list[Knob], dict[str, str]]:
    """``(kept, dropped)`` with each knob of ``whys`` that has a reason moved from kept to dropped."""
    gone = {k.name: whys[k.name] for k in kept if whys.get(k.name) is not None}
    return [k for k in kept if k.name not in gone], {**dropped, **{k: str(v) for k, v in gone.items()}}
