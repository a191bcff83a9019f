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
* ``sd35-tiny``: ``sd3-tiny`` with SD3.5's RMSNorm on queries and keys
  (``qk_norm: rms_norm``), for CPU tests of the KERNEL phase.
* ``sd3-medium-shaped``: the MMDiT of Stable Diffusion 3 Medium (24 joint
  blocks, 1536 wide, 24 heads, patch 2, 16 latent channels; 2.0B
  parameters) with SD3's VAE, for a GPU; its text encoders are small (they
  run once per prompt, not per step) and T5 is absent (zeros of T5's shape,
  256 tokens, are still attended to by every block).
* ``flux-tiny``: a FluxPipeline (FluxTransformer2DModel: double- and
  single-stream blocks, rotary positions, guidance embedding as in
  FLUX.1-dev, so no CFG batch) with a tiny CLIP and a tiny T5 encoder, for
  CPU tests.
* ``flux-dev-shaped``: FLUX.1-dev's transformer (19 double and 38 single
  blocks, 3072 wide, 24 heads of 128, 64 packed latent channels; 11.9B
  parameters) with the 16-channel VAE, for a GPU; its CLIP and T5 are small
  but of Flux's widths (768 pooled, 4096 per T5 token, 512 tokens).

The tokenizers are CLIP tokenizers over a byte-level vocabulary built here
(no merges) and, for T5, a unigram tokenizer over the same characters: every
prompt is tokenized for real, one token per character.
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
    "byte_t5_tokenizer",
    "uses_cfg_batch",
]

_CLIP_TINY = {"hidden_size": 32, "intermediate_size": 37, "num_attention_heads": 4, "num_hidden_layers": 2,
              "vocab_size": 1000, "max_position_embeddings": 77, "bos_token_id": 0, "eos_token_id": 2,
              "pad_token_id": 1, "layer_norm_eps": 1e-5}

_VAE_TINY = {"block_out_channels": [8, 16], "in_channels": 3, "out_channels": 3, "latent_channels": 4,
             "down_block_types": ["DownEncoderBlock2D"] * 2, "up_block_types": ["UpDecoderBlock2D"] * 2,
             "norm_num_groups": 4, "sample_size": 32, "use_quant_conv": False, "use_post_quant_conv": False}
_VAE_16CH = {"block_out_channels": [128, 256, 512, 512], "in_channels": 3, "out_channels": 3, "latent_channels": 16,
             "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4,
             "layers_per_block": 2, "norm_num_groups": 32, "sample_size": 1024, "use_quant_conv": False,
             "use_post_quant_conv": False}
_T5_TINY = {"vocab_size": 300, "d_model": 32, "d_ff": 37, "d_kv": 8, "num_heads": 4, "num_layers": 2,
            "relative_attention_num_buckets": 8}


def _sd3_tiny(**denoiser: Any) -> dict[str, Any]:
    """An SD3 preset at the tiny size: a 2-layer MMDiT (``denoiser``: what differs), the tiny VAE, SD3's two CLIP
    encoders with projection (tiny), no T5."""
    return {
        "family": "sd3",
        "denoiser": {"sample_size": 16, "patch_size": 1, "in_channels": 4, "num_layers": 2, "attention_head_dim": 8,
                     "num_attention_heads": 4, "caption_projection_dim": 32, "joint_attention_dim": 32,
                     "pooled_projection_dim": 64, "out_channels": 4, **denoiser},
        "vae": dict(_VAE_TINY, shift_factor=0.0609, scaling_factor=1.5035),
        "text_encoders": [dict(_CLIP_TINY, projection_dim=32) for _ in range(2)],
        "call": {"max_sequence_length": 16},
    }


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
    "sd3-tiny": _sd3_tiny(),
    # SD3.5's MMDiT change at the tiny size: RMSNorm on q and k (the KERNEL phase's target)
    "sd35-tiny": _sd3_tiny(qk_norm="rms_norm"),
    "sd3-medium-shaped": {
        "family": "sd3",
        "denoiser": {"sample_size": 128, "patch_size": 2, "in_channels": 16, "num_layers": 24,
                     "attention_head_dim": 64, "num_attention_heads": 24, "caption_projection_dim": 1536,
                     "joint_attention_dim": 4096, "pooled_projection_dim": 2048, "out_channels": 16,
                     "pos_embed_max_size": 192},
        "vae": dict(_VAE_16CH, shift_factor=0.0609, scaling_factor=1.5305),
        "text_encoders": [dict(_CLIP_TINY, hidden_size=256, intermediate_size=1024, projection_dim=768),
                          dict(_CLIP_TINY, hidden_size=256, intermediate_size=1024, projection_dim=1280)],
        "call": {"max_sequence_length": 256},
    },
    "flux-tiny": {
        "family": "flux",
        "denoiser": {"patch_size": 1, "in_channels": 16, "num_layers": 2, "num_single_layers": 2,
                     "attention_head_dim": 16, "num_attention_heads": 2, "joint_attention_dim": 32,
                     "pooled_projection_dim": 32, "guidance_embeds": True, "axes_dims_rope": [4, 4, 8]},
        "vae": dict(_VAE_TINY, shift_factor=0.1159, scaling_factor=0.3611),
        "text_encoders": [dict(_CLIP_TINY)],
        "t5": dict(_T5_TINY),
        "call": {"max_sequence_length": 16},
    },
    "flux-dev-shaped": {
        "family": "flux",
        "denoiser": {"patch_size": 1, "in_channels": 64, "num_layers": 19, "num_single_layers": 38,
                     "attention_head_dim": 128, "num_attention_heads": 24, "joint_attention_dim": 4096,
                     "pooled_projection_dim": 768, "guidance_embeds": True, "axes_dims_rope": [16, 56, 56]},
        "vae": dict(_VAE_16CH, shift_factor=0.1159, scaling_factor=0.3611),
        "text_encoders": [dict(_CLIP_TINY, hidden_size=768, intermediate_size=1024, num_attention_heads=12)],
        "t5": dict(_T5_TINY, d_model=4096, d_ff=1024, d_kv=64, num_heads=8),
        "call": {"max_sequence_length": 512},
    },
}

#: Scheduler names a spec may fix, per pipeline family (``default``: the preset's own).
SCHEDULERS: dict[str, dict[str, str]] = {
    "unet": {"default": "DDIMScheduler", "ddim": "DDIMScheduler", "euler": "EulerDiscreteScheduler",
             "dpm-solver": "DPMSolverMultistepScheduler", "pndm": "PNDMScheduler"},
    "sd3": {"default": "FlowMatchEulerDiscreteScheduler", "flow-euler": "FlowMatchEulerDiscreteScheduler"},
    "flux": {"default": "FlowMatchEulerDiscreteScheduler", "flow-euler": "FlowMatchEulerDiscreteScheduler"},
}


# Stable Diffusion's own noise schedule for the UNet family; flow matching's defaults for SD3.
_SCHEDULER_ARGS: dict[str, dict[str, Any]] = {
    "unet": {"beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear", "steps_offset": 1,
             "clip_sample": False, "set_alpha_to_one": False},
    "sd3": {"shift": 3.0},
    # FLUX.1-dev's: the shift grows with the image's token count (FluxPipeline passes mu)
    "flux": {"shift": 3.0, "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15,
             "base_image_seq_len": 256, "max_image_seq_len": 4096},
}

_DENOISERS = {"unet": "UNet2DConditionModel", "sd3": "SD3Transformer2DModel", "flux": "FluxTransformer2DModel"}


def is_pipeline_dir(path: str | Path) -> bool:
    return (Path(path) / "model_index.json").is_file()


def preset_family(model: str) -> str:
    """``unet``, ``sd3`` or ``flux`` for a preset; a local directory's from its ``model_index.json``."""
    if model in DIFFUSION_PRESETS:
        return str(DIFFUSION_PRESETS[model]["family"])
    import json

    index = json.loads((Path(model) / "model_index.json").read_text(encoding="utf-8"))
    if "transformer" not in index:
        return "unet"
    entry = index["transformer"]
    return "flux" if isinstance(entry, list) and "Flux" in str(entry[-1]) else "sd3"


def uses_cfg_batch(family: str, guidance_scale: float) -> bool:
    """Whether each step runs the denoiser on a doubled (classifier-free guidance) batch: UNet and SD3
    pipelines above guidance 1; Flux embeds the guidance scale instead (FLUX.1-dev), one branch."""
    return family != "flux" and guidance_scale > 1.0


def pipeline_info(model: str) -> dict[str, str]:
    """``model_type`` (the family) and ``architecture`` (the denoiser's class) of a preset or a local directory."""
    family = preset_family(model)
    arch = _DENOISERS[family]
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


def byte_t5_tokenizer() -> Any:
    """A real T5 (unigram) tokenizer over the same byte-level characters, plus the word marker."""
    from transformers import T5Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -1.0)]
    pieces += [(c, -2.0) for c in bytes_to_unicode().values()]
    return T5Tokenizer(vocab=pieces, extra_ids=0)


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
    import diffusers

    family = preset_family(model)
    cls = getattr(diffusers, _DENOISERS[family])
    return _component(model, device, cls, "denoiser", "unet" if family == "unet" else "transformer")


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
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    with torch.device(device):
        den = _seeded(seed, lambda: build_denoiser(model, device))
        vae = _seeded(seed + 1, lambda: diffusers.AutoencoderKL(**p["vae"]))
        encs = []
        for i, cfg in enumerate(p["text_encoders"]):
            cls = CLIPTextModelWithProjection if "projection_dim" in cfg else CLIPTextModel
            encs.append(_seeded(seed + 2 + i, lambda cfg=cfg, cls=cls: cls(CLIPTextConfig(**cfg))))
        if "t5" in p:
            encs.append(_seeded(seed + 2 + len(encs), lambda: T5EncoderModel(T5Config(**p["t5"]))))
    if p["family"] == "flux":
        pipe = diffusers.FluxPipeline(
            transformer=den, vae=vae, text_encoder=encs[0], tokenizer=byte_clip_tokenizer(), text_encoder_2=encs[1],
            tokenizer_2=byte_t5_tokenizer(), scheduler=sched)
    elif p["family"] == "unet":
        pipe = diffusers.StableDiffusionPipeline(
            unet=den, vae=vae, text_encoder=encs[0], tokenizer=byte_clip_tokenizer(), scheduler=sched,
            safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    else:
        pipe = diffusers.StableDiffusion3Pipeline(
            transformer=den, vae=vae, text_encoder=encs[0], text_encoder_2=encs[1], tokenizer=byte_clip_tokenizer(),
            tokenizer_2=byte_clip_tokenizer(), text_encoder_3=None, tokenizer_3=None, scheduler=sched)
    for part in pipe.components.values():  # built from configs: in training mode (T5's dropout would be live)
        if isinstance(part, torch.nn.Module):
            part.eval()
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device=device, dtype=dtype)
