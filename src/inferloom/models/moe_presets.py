"""MoE architectures as shapes: Hugging Face config fields of real MoE models, for the cost model and
roofline (``measure/costs.py`` counts their active parameters) and vLLM's fused-MoE tuning (issue 33).

* ``olmoe-1b-7b``: allenai/OLMoE-1B-7B-0924's ``config.json`` (``OlmoeForCausalLM``: 16 layers, hidden
  2048, 16 heads, 64 experts of intermediate 1024, 8 per token, vocabulary 50304, untied). Its fused-MoE
  shape is ``E=64, N=1024`` (tensor parallel 1): vLLM 0.32's shipped configs folder has H200 files for
  E=64 only at N=320, 640, 1280 and 2560 (read from the installed package, 2026-12-03), so on an H200
  vLLM runs its default Triton config for it (``tests/test_moe_presets.py`` checks the installed folder
  where one is installed). Stored parameters ~6.9B, active ~1.3B per token (the model card's figures,
  which the cost model's counts reproduce).

Shapes only: no weights and no tokenizer are built from these here (a session on one needs a model
directory: random weights through vLLM's ``--load-format dummy`` or written ones).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MOE_PRESETS"]

MOE_PRESETS: dict[str, dict[str, Any]] = {
    "olmoe-1b-7b": {
        "architecture": "OlmoeForCausalLM",
        "model_type": "olmoe",
        "hidden_size": 2048,
        "intermediate_size": 1024,
        "num_hidden_layers": 16,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "num_experts": 64,
        "num_experts_per_tok": 8,
        "vocab_size": 50304,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    },
}
