"""A preset written out as a Hugging Face model directory: seeded random
weights (safetensors), config, generation config and the locally built
tokenizer, loadable by ``from_pretrained`` or a vLLM server.

Its own module because it joins the two halves of ``models``: the preset
shapes and weights (``presets.py``) and the built tokenizer
(``tokenizer.py``, which reads the preset table).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from inferloom.models.presets import PRESETS, build_model
from inferloom.models.tokenizer import build_tokenizer, save_tokenizer

if TYPE_CHECKING:
    import torch

__all__ = ["save_preset"]


def save_preset(
    name: str,
    out_dir: str | Path,
    seed: int = 0,
    dtype: "str | torch.dtype" = "float32",
    device: str = "cpu",
) -> Path:
    """Write a preset with its seeded random weights (safetensors), config,
    generation config and the built tokenizer to ``out_dir``: a real Hugging
    Face model directory that ``from_pretrained`` or a vLLM server can load."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {', '.join(sorted(PRESETS))}")
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    model = build_model(name, dtype, device, seed, attn_implementation=None)
    try:
        model.save_pretrained(str(out), safe_serialization=True)
    except TypeError:  # safe_serialization removed (safetensors is the only format)
        model.save_pretrained(str(out))
    save_tokenizer(build_tokenizer(PRESETS[name]["vocab_size"]), out)
    del model
    return out
