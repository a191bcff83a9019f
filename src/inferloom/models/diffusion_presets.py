"""Named diffusion pipeline presets: diffusers configs with seeded random weights.

No model hub is reachable, so a preset is the shapes of each component (the
denoiser, the VAE, the text encoders) plus the pipeline class; weights are
drawn when the pipeline is built: every component is constructed in float32
on the target device right after ``torch.manual_seed(seed + i)`` (``i``: the
component's index), then cast. So every configuration of one spec holds the
same weights, and a bfloat16 build is the float32 build rounded.

Presets:

* ``sd-unet-tiny``: a StableDiffusionPipeline (UNet2DConditionModel, a tiny
  CLIP text encoder, AutoencoderKL) for CPU tests (32x32 or 64x64).
* ``sd3-tiny``: a StableDiffusion3Pipeline (SD3Transformer2DModel, an
  MMDiT) with tiny CLIP encoders and no T5 (its embeddings are zeros, as
  diffusers does without ``text_encoder_3``), for CPU tests.
* ``sd3-medium-shaped``: the MMDiT of Stable Diffusion 3 Medium (24 joint
  blocks, 1536 wide, 24 heads, patch 2, 16 latent channels; 2.0B
  parameters) with SD3's VAE, for a GPU; its text encoders are small (they
  run once per prompt, not per step) and T5 is absent (zeros of T5's shape,
  256 tokens, are still attended to by every block).

The tokenizers are CLIP tokenizers over a byte-level vocabulary built here
(no merges): every prompt is tokenized for real, one token per character.
A local diffusers pipeline directory (``model_index.json``) is loaded with
``DiffusionPipeline.from_pretrained``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = [
    "DIFFUSION_PRESETS",
    "SCHEDULERS",
    "is_pipeline_dir",
    "preset_family",
    "pipeline_info",
    "build_pipeline",
    "build_denoiser",
    "build_vae",
    "byte_clip_tokenizer",
]

_CLIP_TINY = {"hidden_size": 32, "intermediate_size": 37, "num_attention_heads": 4, "num_hidden_layers": 2,
              "vocab_size": 1000, "max_position_embeddings": 77, "bos_token_id": 0, "eos_token_id": 2,
              "pad_token_id": 1, "layer_norm_eps": 1e-5}

# Shapes only. Each preset: the pipeline family, its components' configs and the call's fixed arguments.
DIFFUSION_PRESETS: dict[str, dict[str, Any]] = {
    "sd-unet-tiny": {
        "family": "unet",
        "denoiser": {"block_out_channels": [16, 32], "layers_per_block": 1, "sample_size": 16, "in_channels": 4,
                     "out_channels": 4, "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D"],
                     "up_block_types": ["CrossAttnUpBlock2D", "UpBlock2D"], "cross_attention_dim": 32,
                     "norm_num_groups": 8, "attention_head_dim": 8},
        "vae": {"block_out_channels": [8, 16], "in_channels": 3, "out_channels": 3, "latent_channels": 4,
                "down_block_types": ["DownEncoderBlock2D"] * 2, "up_block_types": ["UpDecoderBlock2D"] * 2,
                "norm_num_groups": 4, "sample_size": 32},
        "text_encoders": [dict(_CLIP_TINY)],
        "call": {},
    },
    "sd3-tiny": {
        "family": "sd3",
        "denoiser": {"sample_size": 16, "patch_size": 1, "in_channels": 4, "num_layers": 2, "attention_head_dim": 8,
                     "num_attention_heads": 4, "caption_projection_dim": 32, "joint_attention_dim": 32,
                     "pooled_projection_dim": 64, "out_channels": 4},
        "vae": {"block_out_channels": [8, 16], "in_channels": 3, "out_channels": 3, "latent_channels": 4,
                "down_block_types": ["DownEncoderBlock2D"] * 2, "up_block_types": ["UpDecoderBlock2D"] * 2,
                "norm_num_groups": 4, "sample_size": 32, "use_quant_conv": False, "use_post_quant_conv": False,
                "shift_factor": 0.0609, "scaling_factor": 1.5035},
        "text_encoders": [dict(_CLIP_TINY, projection_dim=32), dict(_CLIP_TINY, projection_dim=32)],
        "call": {"max_sequence_length": 16},
    },
    "sd3-medium-shaped": {
        "family": "sd3",
        "denoiser": {"sample_size": 128, "patch_size": 2, "in_channels": 16, "num_layers": 24,
                     "attention_head_dim": 64, "num_attention_heads": 24, "caption_projection_dim": 1536,
                     "joint_attention_dim": 4096, "pooled_projection_dim": 2048, "out_channels": 16,
                     "pos_embed_max_size": 192},
        "vae": {"block_out_channels": [128, 256, 512, 512], "in_channels": 3, "out_channels": 3, "latent_channels": 16,
                "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4,
                "layers_per_block": 2, "norm_num_groups": 32, "sample_size": 1024, "use_quant_conv": False,
                "use_post_quant_conv": False, "shift_factor": 0.0609, "scaling_factor": 1.5305},
        "text_encoders": [dict(_CLIP_TINY, hidden_size=256, intermediate_size=1024, projection_dim=768),
                          dict(_CLIP_TINY, hidden_size=256, intermediate_size=1024, projection_dim=1280)],
        "call": {"max_sequence_length": 256},
    },
}

#: Scheduler names a spec may fix, per pipeline family (``default``: the preset's own).
SCHEDULERS: dict[str, dict[str, str]] = {
    "unet": {"default": "DDIMScheduler", "ddim": "DDIMScheduler", "euler": "EulerDiscreteScheduler",
             "dpm-solver": "DPMSolverMultistepScheduler", "pndm": "PNDMScheduler"},
    "sd3": {"default": "FlowMatchEulerDiscreteScheduler", "flow-euler": "FlowMatchEulerDiscreteScheduler"},
}


# Stable Diffusion's own noise schedule for the UNet family; flow matching's defaults for SD3.
_SCHEDULER_ARGS: dict[str, dict[str, Any]] = {
    "unet": {"beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear", "steps_offset": 1,
             "clip_sample": False, "set_alpha_to_one": False},
    "sd3": {"shift": 3.0},
}


def is_pipeline_dir(path: str | Path) -> bool:
    return (Path(path) / "model_index.json").is_file()


def preset_family(model: str) -> str:
    """``unet`` or ``sd3`` for a preset; a local directory's from its ``model_index.json``."""
    if model in DIFFUSION_PRESETS:
        return str(DIFFUSION_PRESETS[model]["family"])
    import json

    index = json.loads((Path(model) / "model_index.json").read_text(encoding="utf-8"))
    return "sd3" if "transformer" in index else "unet"


def pipeline_info(model: str) -> dict[str, str]:
    """``model_type`` (the family) and ``architecture`` (the denoiser's class) of a preset or a local directory."""
    family = preset_family(model)
    arch = "UNet2DConditionModel" if family == "unet" else "SD3Transformer2DModel"
    if model not in DIFFUSION_PRESETS:
        import json

        index = json.loads((Path(model) / "model_index.json").read_text(encoding="utf-8"))
        entry = index.get("transformer") or index.get("unet")
        arch = str(entry[1]) if isinstance(entry, list) and len(entry) == 2 else "unknown"
    return {"model_type": family, "architecture": arch}


def byte_clip_tokenizer(max_length: int = 77) -> Any:
    """A real CLIPTokenizer over a byte-level vocabulary (no merges: a token per character)."""
    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    chars = list(bytes_to_unicode().values())
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in chars:
        vocab[c] = len(vocab)
    for c in chars:
        vocab[c + "</w>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=max_length)


def _seeded(seed: int, build: Any) -> Any:
    import torch

    torch.manual_seed(seed)
    return build()


def _component(model: str, device: str, cls: Any, preset_key: str, subfolder: str) -> Any:
    import torch

    with torch.device(device):
        if model in DIFFUSION_PRESETS:
            return cls(**DIFFUSION_PRESETS[model][preset_key])
        return cls.from_config(cls.load_config(str(Path(model) / subfolder)))


def build_denoiser(model: str, device: str = "meta") -> Any:
    """The denoiser alone, from its config (``meta``: shapes without memory, for cost counting)."""
    from diffusers import SD3Transformer2DModel, UNet2DConditionModel

    if preset_family(model) == "unet":
        return _component(model, device, UNet2DConditionModel, "denoiser", "unet")
    return _component(model, device, SD3Transformer2DModel, "denoiser", "transformer")


def build_vae(model: str, device: str = "meta") -> Any:
    """The VAE alone, from its config."""
    from diffusers import AutoencoderKL

    return _component(model, device, AutoencoderKL, "vae", "vae")


def build_pipeline(model: str, dtype: Any, device: str, seed: int, scheduler: str = "default") -> Any:
    """The pipeline of a preset (seeded random weights) or a local directory, on ``device`` in ``dtype``."""
    import diffusers
    import torch

    if model not in DIFFUSION_PRESETS:
        pipe = diffusers.DiffusionPipeline.from_pretrained(model, local_files_only=True)  # float32, then cast
        if scheduler != "default":
            family = preset_family(model)
            pipe.scheduler = getattr(diffusers, SCHEDULERS[family][scheduler]).from_config(pipe.scheduler.config)
        pipe.set_progress_bar_config(disable=True)
        return pipe.to(device=device, dtype=dtype)
    p = DIFFUSION_PRESETS[model]
    sched = getattr(diffusers, SCHEDULERS[p["family"]][scheduler]).from_config(_SCHEDULER_ARGS[p["family"]])
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    with torch.device(device):
        den = _seeded(seed, lambda: build_denoiser(model, device))
        vae = _seeded(seed + 1, lambda: diffusers.AutoencoderKL(**p["vae"]))
        encs = []
        for i, cfg in enumerate(p["text_encoders"]):
            cls = CLIPTextModelWithProjection if "projection_dim" in cfg else CLIPTextModel
            encs.append(_seeded(seed + 2 + i, lambda cfg=cfg, cls=cls: cls(CLIPTextConfig(**cfg))))
    if p["family"] == "unet":
        pipe = diffusers.StableDiffusionPipeline(
            unet=den, vae=vae, text_encoder=encs[0], tokenizer=byte_clip_tokenizer(), scheduler=sched,
            safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    else:
        pipe = diffusers.StableDiffusion3Pipeline(
            transformer=den, vae=vae, text_encoder=encs[0], text_encoder_2=encs[1], tokenizer=byte_clip_tokenizer(),
            tokenizer_2=byte_clip_tokenizer(), text_encoder_3=None, tokenizer_3=None, scheduler=sched)
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device=device, dtype=dtype)
