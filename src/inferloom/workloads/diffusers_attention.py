"""Which forced SDPA kernel can run every attention of a pipeline, known
before anything is built or timed.

``sdpa_backend`` forces one torch SDPA kernel around the whole pipeline call,
so every attention in it must fit that kernel: the denoiser's, the VAE's
(its mid-block attends with one head as wide as its last block, 512 in SD3's
and Flux's VAE) and the CLIP text encoders'. On CUDA the fused kernels have
limits (torch's ``sdp_utils.cpp``): flash takes head dims up to 256 and only
float16/bfloat16; cuDNN up to 128 (256 on compute capability 9.0, i.e.
H100/H200), multiples of 8, float16/bfloat16; memory-efficient has no upper
bound but needs head dims aligned to 8 (half precision) or 4 (float32).
A pipeline outside a limit fails with "No available kernel" at its first
call; :func:`attention_refusal` says so up front, naming the component, its
head dim and the limit, so the engine refuses the configuration in
``prepare`` and the session's orchestrator never proposes it
(:class:`~inferloom.workloads.base.CrossKnobRules`). On the CPU, torch's
flash kernel takes any head dim.

:func:`attention_head_dims` reads the head dims off the components built
from their configs on the ``meta`` device (no memory, no weights: a local
pipeline directory needs only its config files). T5's attention is left out:
it multiplies and softmaxes itself (relative position bias), never calling SDPA.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Mapping

from inferloom.models.diffusion_presets import DIFFUSION_PRESETS, build_denoiser, build_vae

__all__ = ["attention_head_dims", "head_dims_of", "attention_refusal", "cuda_capability"]

_NO_SDPA = ("T5Attention",)  # attention classes that never call scaled_dot_product_attention
_HALF = ("float16", "bfloat16")


def head_dims_of(components: Mapping[str, Any]) -> dict[str, list[int]]:
    """The distinct attention head dims of each component (``{name: sorted dims}``; components without
    attention are left out)."""
    out: dict[str, list[int]] = {}
    for name, comp in components.items():
        dims: set[int] = set()
        for mod in comp.modules():
            cls = type(mod).__name__
            if "Attention" not in cls or cls in _NO_SDPA:
                continue
            hd = getattr(mod, "head_dim", None)
            if not isinstance(hd, int):
                inner, heads = getattr(mod, "inner_dim", None), getattr(mod, "heads", None)
                hd = inner // heads if isinstance(inner, int) and isinstance(heads, int) and heads > 0 else None
            if isinstance(hd, int) and hd > 0:
                dims.add(hd)
        if dims:
            out[name] = sorted(dims)
    return out


def _text_encoders(model: str) -> dict[str, Any]:
    import torch
    import transformers

    with torch.device("meta"):
        if model in DIFFUSION_PRESETS:
            p = DIFFUSION_PRESETS[model]
            encs = {("text_encoder" if i == 0 else f"text_encoder_{i + 1}"): transformers.CLIPTextModel(
                transformers.CLIPTextConfig(**{k: v for k, v in cfg.items() if k != "projection_dim"}))
                for i, cfg in enumerate(p["text_encoders"])}
            return encs
        index = json.loads((Path(model) / "model_index.json").read_text(encoding="utf-8"))
        encs = {}
        for name, entry in index.items():
            if name.startswith("text_encoder") and isinstance(entry, list) and entry[0] == "transformers":
                cfg = transformers.AutoConfig.from_pretrained(str(Path(model) / name))
                encs[name] = getattr(transformers, entry[1])._from_config(cfg)
        return encs


@functools.lru_cache(maxsize=16)
def _dims(model: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    comps = {"denoiser": build_denoiser(model, "meta"), "vae": build_vae(model, "meta"), **_text_encoders(model)}
    return tuple((k, tuple(v)) for k, v in head_dims_of(comps).items())


def attention_head_dims(model: str) -> dict[str, list[int]]:
    """Head dims of every SDPA attention of a preset's or a local pipeline directory's components, from their
    configs (``denoiser``, ``vae``, ``text_encoder``, ...)."""
    return {k: list(v) for k, v in _dims(model)}


def cuda_capability() -> tuple[int, int] | None:
    """The first CUDA device's compute capability, or None without one."""
    import torch

    return tuple(torch.cuda.get_device_capability(0)) if torch.cuda.is_available() else None  # type: ignore[return-value]


def attention_refusal(backend: str, device: str, dtype: str, head_dims: Mapping[str, list[int]],
                      capability: tuple[int, int] | None = None) -> str | None:
    """Why forcing SDPA kernel ``backend`` cannot run every attention of a pipeline with ``head_dims`` on
    ``device`` in ``dtype``, else None. ``capability``: the CUDA device's (for cuDNN's limit)."""
    if backend in ("auto", "math") or device != "cuda":
        return None
    limit, align, dtypes = {
        "flash": (256, 1, _HALF),
        "cudnn": (256 if capability == (9, 0) else 128, 8, _HALF),
        "efficient": (None, 8 if dtype in _HALF else 4, _HALF + ("float32",)),
    }[backend]
    if dtype not in dtypes:
        return f"the {backend} SDPA kernel takes only {', '.join(dtypes)}; dtype is {dtype}"
    for comp, dims in head_dims.items():
        for hd in dims:
            if limit is not None and hd > limit:
                return (f"the {comp}'s attention has head dim {hd}; the {backend} SDPA kernel takes at most {limit} "
                        "and the kernel is forced around the whole pipeline call (use auto, math or efficient)")
            if hd % align:
                return f"the {comp}'s attention has head dim {hd}; the {backend} SDPA kernel needs a multiple of {align}"
    return None
