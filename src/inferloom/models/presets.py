"""Named synthetic model presets: a Hugging Face config with random weights.

No model hub is reachable on the machines inferloom is developed on, so a
preset is a config (shapes only); weights are drawn from a seeded RNG when the
model is built, and a tokenizer is built locally (see ``tokenizer.py``).

Weights of a preset are a pure function of ``(preset, seed, device type)``:
every matrix is drawn in float32 from its own generator (seeded from ``seed``
and the parameter's name), then rounded to the requested dtype. So a bfloat16
build is exactly the float32 build rounded to bfloat16, and the quality
contract compares like with like.

Writing a preset out as a model directory (weights plus tokenizer) is
``preset_dir.py``; this module does not import the tokenizer.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # heavy imports stay inside functions: spec.py imports PRESETS
    import torch

__all__ = [
    "PRESETS",
    "preset_config",
    "build_model",
    "model_info",
    "parse_dtype",
]

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

# Special token ids of the locally built tokenizer (see tokenizer.py).
_SPECIAL_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def parse_dtype(dtype: "str | torch.dtype") -> "torch.dtype":
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in table:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(table)}")
    return table[dtype]


def preset_config(name: str, attn_implementation: str | None = None) -> Any:
    """The ``LlamaConfig`` of a preset (special token ids match the built tokenizer)."""
    from transformers import LlamaConfig

    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {', '.join(sorted(PRESETS))}")
    shape = dict(PRESETS[name])
    arch = shape.pop("architecture")
    if arch != "LlamaForCausalLM":  # pragma: no cover - only Llama presets exist
        raise ValueError(f"preset {name!r}: unsupported architecture {arch}")
    cfg = LlamaConfig(**shape, **_SPECIAL_IDS)
    cfg.architectures = [arch]
    if attn_implementation is not None:
        cfg._attn_implementation = attn_implementation
    return cfg


def _generation_config(cfg: Any) -> Any:
    from transformers import GenerationConfig

    return GenerationConfig(
        bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id
    )


# Standard deviation of the output logits that a preset's LM head is drawn for.
# With Llama's plain init (std 0.02) the next-token distribution of a random
# model is nearly uniform (median top-1 probability ~1/vocab), so every
# rounding difference flips the argmax and a KL check has nothing to measure.
# Trained LMs are peaked; a logit spread of this size gives random presets a
# peaked, real-LM-like distribution without changing any shape or cost.
PRESET_LOGIT_STD = 3.0


def _seeded_init(model: Any, seed: int, std: float) -> None:
    """Deterministic, dtype-independent weights: each matrix drawn in float32
    from its own generator on the model's device, then cast; vectors (norm
    scales) set to one. Llama's own init scheme (normal(0, std)), except the
    LM head, drawn for logits of std ``PRESET_LOGIT_STD`` (the final RMSNorm
    makes the hidden state's norm sqrt(hidden))."""
    import math

    import torch

    hidden = int(model.config.hidden_size)

    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if param.dim() < 2:
                param.fill_(1.0)
                continue
            gen = torch.Generator(device=param.device)
            gen.manual_seed((int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1))
            draw = torch.empty(param.shape, dtype=torch.float32, device=param.device)
            draw.normal_(0.0, PRESET_LOGIT_STD / math.sqrt(hidden) if name == "lm_head.weight" else std, generator=gen)
            param.copy_(draw)
            del draw


def _from_config(cfg: Any, dtype: "torch.dtype", attn_implementation: str | None) -> Any:
    from transformers import AutoModelForCausalLM

    # transformers >= 4.56 names the argument ``dtype`` (``torch_dtype`` is deprecated).
    kwargs: dict[str, Any] = {"dtype": dtype}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    return AutoModelForCausalLM.from_config(cfg, **kwargs)


def build_model(
    spec_model: str,
    dtype: "str | torch.dtype",
    device: str,
    seed: int,
    attn_implementation: str | None = "sdpa",
) -> Any:
    """A causal LM in eval mode on ``device`` in ``dtype``.

    A preset is built directly on the target device (no CPU copy of the
    weights) with seeded random weights; a local directory is loaded with
    ``from_pretrained(local_files_only=True)``.
    """
    import torch

    dtype = parse_dtype(dtype)
    if spec_model in PRESETS:
        cfg = preset_config(spec_model, attn_implementation)
        prev = torch.get_default_dtype()
        try:
            with torch.device(device):
                model = _from_config(cfg, dtype, attn_implementation)
        finally:
            torch.set_default_dtype(prev)
        _seeded_init(model, seed, float(getattr(cfg, "initializer_range", 0.02)))
        model.generation_config = _generation_config(cfg)
        return model.eval()
    return _load_local(spec_model, dtype, device, attn_implementation).eval()


def _load_local(path: str, dtype: "torch.dtype", device: str, attn_implementation: str | None) -> Any:
    from transformers import AutoModelForCausalLM

    if not Path(path).expanduser().is_dir():
        raise ValueError(f"model {path!r}: not a preset and not a local directory")
    kwargs: dict[str, Any] = {"local_files_only": True, "dtype": dtype}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if device != "cpu":
        try:
            return AutoModelForCausalLM.from_pretrained(str(path), device_map=device, **kwargs)
        except (ImportError, ValueError) as exc:  # device_map may need accelerate on some versions
            if "accelerate" not in str(exc).lower():
                raise
    return AutoModelForCausalLM.from_pretrained(str(path), **kwargs).to(device)


def model_info(model: Any, dtype: "str | torch.dtype | None" = None) -> dict[str, Any]:
    """Parameter count, architecture and shapes of a built model, or of a
    preset name / local directory (counted on the meta device, no weights;
    ``dtype`` then sets the dtype the weight bytes are counted in)."""
    import torch

    if isinstance(model, (str, Path)):
        name = str(model)
        if name in PRESETS:
            cfg = preset_config(name)
        else:
            from transformers import AutoConfig

            cfg = AutoConfig.from_pretrained(name, local_files_only=True)
        with torch.device("meta"):
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_config(cfg, dtype=parse_dtype(dtype or "float32"))
    cfg = model.config
    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    weight_bytes = sum(p.numel() * p.element_size() for p in params)
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in params})
    archs = getattr(cfg, "architectures", None) or [type(model).__name__]
    return {
        "architecture": archs[0],
        "model_type": getattr(cfg, "model_type", None),
        "parameters": int(n_params),
        "weight_bytes": int(weight_bytes),
        "dtype": dtypes[0] if len(dtypes) == 1 else dtypes,
        "num_layers": getattr(text_cfg, "num_hidden_layers", None),
        "hidden_size": getattr(text_cfg, "hidden_size", None),
        "intermediate_size": getattr(text_cfg, "intermediate_size", None),
        "num_attention_heads": getattr(text_cfg, "num_attention_heads", None),
        "num_key_value_heads": getattr(text_cfg, "num_key_value_heads", None),
        "head_dim": getattr(text_cfg, "head_dim", None),
        "vocab_size": getattr(text_cfg, "vocab_size", None),
        "max_position_embeddings": getattr(text_cfg, "max_position_embeddings", None),
    }
