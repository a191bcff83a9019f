"""Write the two model directories of benchmarks/fleet_two_gpu.sh's fleet: two Llama shapes with seeded
random weights, each a real Hugging Face directory (safetensors, config, generation config, the built
tokenizer) written by :func:`inferloom.models.preset_dir.save_preset`, so the weights are drawn exactly as
a preset's are (same seeded init, same LM-head logit spread, same tokenizer).

Two different shapes, not one shape twice: two KB groups, so the fleet's planner puts neither session
behind the other (both are leaders: one per GPU at once), and each files its own recipe.

  --device cuda: ``llama-3.2-1b`` (Meta's Llama-3.2-1B shape, untied head: 16 layers, hidden 2048) and
                 ``tinyllama-1.1b`` (TinyLlama-1.1B: 22 layers, hidden 2048, 4 KV heads, vocab 32000),
                 bf16, built on the GPU (~2.5 GB each on disk).
  --device cpu:  two tiny shapes (``tiny-wide``, ``tiny-deep``), float32: the CPU dry run of the same script.

A directory already complete (config.json and weights) is kept: a second call of the script reuses it.
Prints one JSON line: {name: directory}.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from inferloom.models.preset_dir import save_preset
from inferloom.models.presets import PRESETS

_LLAMA3 = {"vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-5}
SHAPES: dict[str, dict[str, dict]] = {
    "cuda": {
        "llama-3.2-1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                         "num_attention_heads": 32, "num_key_value_heads": 8, **_LLAMA3},
        "tinyllama-1.1b": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
                           "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000,
                           "max_position_embeddings": 2048, "rope_theta": 10000.0, "rms_norm_eps": 1e-5},
    },
    "cpu": {
        "tiny-wide": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "vocab_size": 4096, "max_position_embeddings": 2048,
                      "rope_theta": 10000.0},
        "tiny-deep": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "vocab_size": 4096, "max_position_embeddings": 2048,
                      "rope_theta": 10000.0},
    },
}


def complete(d: Path) -> bool:
    return (d / "config.json").is_file() and any(d.glob("*.safetensors")) and (d / "tokenizer.json").is_file()


def write_models(out: Path, device: str, seed: int = 0) -> dict[str, str]:
    dtype = "bfloat16" if device == "cuda" else "float32"
    out.mkdir(parents=True, exist_ok=True)
    dirs: dict[str, str] = {}
    for name, shape in SHAPES[device].items():
        d = out / name
        if not complete(d):
            tmp = out / f".{name}.partial"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(d, ignore_errors=True)
            # save_preset builds from the preset table: this shape is a preset for this process only
            PRESETS[name] = {"architecture": "LlamaForCausalLM", "tie_word_embeddings": False, **shape}
            try:
                save_preset(name, tmp, seed=seed, dtype=dtype, device=device)
            finally:
                PRESETS.pop(name, None)
            tmp.rename(d)  # complete or absent: a call cut mid-write leaves only the .partial
        dirs[name] = str(d.resolve())
    return dirs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="directory to write the model directories into")
    ap.add_argument("--device", choices=sorted(SHAPES), default="cuda")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    print(json.dumps(write_models(a.out, a.device, a.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
