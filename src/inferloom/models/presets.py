"""Named synthetic model presets: a Hugging Face config with random weights.

No model hub is reachable on the machines inferloom is developed on, so a
preset is a config (shapes only); weights are drawn from a seeded RNG when the
model is built, and a tokenizer is built locally (see ``tokenizer.py``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PRESETS"]

# Shapes only. ``llama-3.1-8b`` matches Meta's Llama-3.1-8B architecture.
PRESETS: dict[str, dict[str, Any]] = {
    "llama-tiny": {
        "architecture": "LlamaForCausalLM",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 4096,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
    "llama-3.1-8b": {
        "architecture": "LlamaForCausalLM",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    },
}
