"""A forced SDPA kernel must fit every attention of the pipeline (issue 16: on the H200 `sdpa_backend=flash`
crashed at the first call: the VAE attends with 512-dim heads). The rule reads the head dims off the
components' configs and refuses up front, naming the component, its head dim and the kernel's limit; the
session's orchestrator gets the rule, so such a configuration never costs a trial."""

import json

import pytest

from inferloom.models.diffusion_presets import DIFFUSION_PRESETS
from inferloom.spec import load_spec
from inferloom.workloads.base import AdapterError
from inferloom.workloads.diffusers_attention import attention_head_dims, attention_refusal


def _config_only_pipeline(root, denoiser=None, vae=None):
    """A local SD3 pipeline directory of config files only (no weights): the tiny preset's shapes, changed."""
    from transformers import CLIPTextConfig

    p = DIFFUSION_PRESETS["sd3-tiny"]
    (root / "model_index.json").write_text(json.dumps({
        "_class_name": "StableDiffusion3Pipeline", "transformer": ["diffusers", "SD3Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"], "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"]}))
    for sub, cls, cfg in (("transformer", "SD3Transformer2DModel", {**p["denoiser"], **(denoiser or {})}),
                          ("vae", "AutoencoderKL", {**p["vae"], **(vae or {})})):
        (root / sub).mkdir()
        (root / sub / "config.json").write_text(json.dumps({"_class_name": cls, **cfg}))
    CLIPTextConfig(**p["text_encoders"][0]).save_pretrained(root / "text_encoder")
    return str(root)


@pytest.mark.parametrize("component,changes,dim", [
    ("denoiser", {"denoiser": {"attention_head_dim": 320, "num_attention_heads": 1, "caption_projection_dim": 320}},
     320),
    ("vae", {"vae": {"block_out_channels": [8, 264]}}, 264),  # the VAE's mid-block: one head as wide as its last block
])
def test_flash_is_refused_where_an_attention_head_is_wider_than_256(tmp_path, component, changes, dim):
    model = _config_only_pipeline(tmp_path, **changes)
    dims = attention_head_dims(model)
    assert dims[component] == [dim] and dims["text_encoder"] == [8]
    why = attention_refusal("flash", "cuda", "bfloat16", dims)
    assert why and f"the {component}'s attention has head dim {dim}" in why and "at most 256" in why
    assert attention_refusal("cudnn", "cuda", "bfloat16", dims, (9, 0)) is not None
    assert attention_refusal("efficient", "cuda", "bfloat16", dims) is None  # no upper bound, aligned to 8
    assert attention_refusal("math", "cuda", "bfloat16", dims) is None
    assert attention_refusal("flash", "cpu", "float32", dims) is None  # torch's CPU flash kernel takes any width
    # the stock tiny pipeline fits flash; cuDNN's limit is 128 off compute capability 9.0
    small = attention_head_dims("sd3-tiny")
    assert attention_refusal("flash", "cuda", "bfloat16", small) is None
    assert "takes only float16, bfloat16" in attention_refusal("flash", "cuda", "float32", small)
    assert "at most 128" in attention_refusal("cudnn", "cuda", "bfloat16", {"denoiser": [192]}, (8, 0))
    assert attention_refusal("cudnn", "cuda", "bfloat16", {"denoiser": [192]}, (9, 0)) is None


def test_the_real_sd3_and_flux_shapes_refuse_flash_for_their_vae():
    for model in ("sd3-medium-shaped", "flux-dev-shaped"):
        dims = attention_head_dims(model)
        assert dims["vae"] == [512] and max(dims["denoiser"]) <= 128, dims
        assert "the vae's attention has head dim 512" in attention_refusal("flash", "cuda", "bfloat16", dims)


def test_the_engine_refuses_before_building_and_the_orchestrator_never_proposes_it(tmp_path):
    from inferloom.phases.runner import default_agents
    from inferloom.workloads.diffusers_engine import DiffusersEngine

    model = _config_only_pipeline(tmp_path, vae={"block_out_channels": [8, 264]})
    spec = load_spec(None, {"framework": "diffusers", "model": model, "device": "cpu", "dtype": "bfloat16",
                            "diffusion.height": "32", "diffusion.width": "32"})
    engine = DiffusersEngine(spec)
    try:
        assert engine.config_refusal({"sdpa_backend": "flash"}) is None  # on the CPU, flash takes 264
        engine.device = "cuda"  # the rule as a CUDA engine applies it (no CUDA device on this machine)
        why = engine.config_refusal({"sdpa_backend": "flash"})
        assert why and why.startswith("knob 'sdpa_backend': flash: the vae's attention has head dim 264"), why
        assert engine.config_refusal({"sdpa_backend": "efficient"}) is None
        # refused in prepare, before the pipeline is built: this directory has no weights to build it from
        with pytest.raises(AdapterError, match="head dim 264") as e:
            engine.prepare({"sdpa_backend": "flash"})
        assert e.value.kind == "unsupported"
        feasible = default_agents(spec, adapter=engine).orchestrator.feasible
        assert feasible({"sdpa_backend": "math"}) and not feasible({"sdpa_backend": "flash"})
    finally:
        engine.close()
