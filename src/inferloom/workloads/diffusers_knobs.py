"""The diffusers engine's knob space, its applicability rules, and how each
knob is applied to a built pipeline.

:func:`diffusers_knobs` is the table (``dtype``, ``sdpa_backend``,
``attn_processor``, ``compile_mode``, ``channels_last``, ``fuse_qkv``,
``vae_slicing``, ``vae_tiling``, ``cfg_mode``, ``tf32_matmul``,
``cpu_threads``; the KERNEL phase's ``rmsnorm_impl``); :func:`check_applicable` refuses a configuration that cannot
work on the device or the pipeline family with ``AdapterError(kind=
'unsupported')`` naming the knob; :func:`apply_knobs` changes a pipeline in
place and returns notes of what it did; :func:`call_state` is the per-call
torch state (threads, TF32, the forced SDPA kernel).

Every knob but ``cpu_threads`` may change the numerics (``changes_numerics``):
a different dtype, attention kernel, fused or compiled kernel, memory layout,
batch split or VAE tiling rounds differently, so the image quality contract
judges each.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Mapping

import torch

from inferloom.models.diffusion_shapes import eager_rmsnorms
from inferloom.workloads.base import AdapterError, Knob
from inferloom.workloads.diffusers_attention import attention_refusal
from inferloom.workloads.diffusers_ops import RMSNORM_IMPLS, apply_rmsnorm_impl
from inferloom.workloads.engine_written import apply_norms as apply_written_norms

__all__ = ["diffusers_knobs", "check_applicable", "apply_knobs", "call_state", "denoiser_of"]

_CUDA = frozenset({"cuda"})
_CPU = frozenset({"cpu"})
_SDPA = ("auto", "math", "flash", "efficient", "cudnn")
_SDPA_CPU_OK = ("auto", "math", "flash")
_COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")


def diffusers_knobs(dtype: str, family: str, startup_threads: int) -> list[Knob]:
    """The knobs of a pipeline of ``family`` (``unet`` or ``sd3``) whose stock dtype is ``dtype``."""
    del family  # every knob is listed; check_applicable refuses what a family cannot do
    ncpu = os.cpu_count() or 1
    return [
        Knob("dtype", "choice", dtype, "weight and activation dtype of every component (float16 is slow on CPUs)",
             choices=("float32", "bfloat16", "float16"), changes_numerics=True),
        Knob("sdpa_backend", "choice", "auto",
             "torch SDPA kernel forced with sdpa_kernel() around each pipeline call (efficient and cudnn are "
             "CUDA-only, flash also has a CPU kernel)", choices=_SDPA, changes_numerics=True),
        Knob("attn_processor", "choice", "sdpa",
             "diffusers attention processor of the UNet: sdpa (AttnProcessor2_0) or classic (AttnProcessor: "
             "baddbmm, softmax, bmm); UNet pipelines only", choices=("sdpa", "classic"), changes_numerics=True),
        Knob("compile_mode", "choice", "off",
             "torch.compile of the denoiser (module.compile, static shapes); reduce-overhead captures CUDA graphs "
             "(CUDA only); compilation happens in the warm-up runs", choices=_COMPILE_MODES, changes_numerics=True),
        Knob("channels_last", "bool", False, "channels_last memory format for the conv models (UNet and VAE)",
             changes_numerics=True),
        Knob("fuse_qkv", "bool", False,
             "fused QKV projections (fuse_qkv_projections() of the denoiser and the VAE: one GEMM instead of three)",
             changes_numerics=True),
        Knob("vae_slicing", "bool", False, "decode the batch one image at a time (AutoencoderKL.enable_slicing)",
             changes_numerics=True),
        Knob("vae_tiling", "bool", False,
             "decode in overlapping tiles (AutoencoderKL.enable_tiling; blends tile seams: changes pixels)",
             changes_numerics=True),
        Knob("cfg_mode", "choice", "batched",
             "classifier-free guidance: batched (stock: one denoiser call over both branches) or split (two calls "
             "of half the batch per step)", choices=("batched", "split"), changes_numerics=True),
        Knob("tf32_matmul", "bool", False, "allow TF32 tensor cores for float32 matmuls and convolutions",
             applies_to=_CUDA, changes_numerics=True),
        Knob("rmsnorm_impl", "choice", "eager",
             "the denoiser's eager RMSNorms (q/k norms; KERNEL phase): eager, torch_fused (F.rms_norm) or triton "
             "(the catalog kernel, CUDA); see workloads/diffusers_ops.py", choices=RMSNORM_IMPLS,
             changes_numerics=True, phase="KERNEL"),
        Knob("cpu_threads", "int", startup_threads, "torch intra-op threads during a run (torch.set_num_threads)",
             low=1, high=max(ncpu, startup_threads), applies_to=_CPU),
    ]


def check_applicable(knobs: list[Knob], cfg: Mapping[str, Any], device: str, family: str, cfg_active: bool,
                     head_dims: Mapping[str, list[int]] | None = None,
                     capability: tuple[int, int] | None = None) -> None:
    """Refuse (``AdapterError(kind='unsupported')``) what cannot run here. ``head_dims``: the pipeline's
    attention head dims per component (:func:`~inferloom.workloads.diffusers_attention.attention_head_dims`),
    checked against a forced SDPA kernel's limits on ``capability`` (the CUDA device's)."""
    for knob in knobs:
        if device not in knob.applies_to and cfg[knob.name] != knob.default:
            raise AdapterError(f"knob '{knob.name}': applies only to {', '.join(sorted(knob.applies_to))}, "
                               f"device is {device}", kind="unsupported")

    def refuse(name: str, why: str) -> None:
        raise AdapterError(f"knob '{name}': {why}", kind="unsupported")

    if device == "cpu" and cfg["sdpa_backend"] not in _SDPA_CPU_OK:
        refuse("sdpa_backend", f"{cfg['sdpa_backend']} is CUDA-only; device is cpu")
    if device == "cpu" and cfg["compile_mode"] == "reduce-overhead":
        refuse("compile_mode", "reduce-overhead captures CUDA graphs; device is cpu")
    if family != "unet" and cfg["attn_processor"] != "sdpa":
        refuse("attn_processor", f"{cfg['attn_processor']} is a UNet attention processor; this pipeline is {family} "
               "(joint attention)")
    if cfg["attn_processor"] != "sdpa" and cfg["sdpa_backend"] != "auto":
        refuse("sdpa_backend", f"forces an SDPA kernel; attn_processor {cfg['attn_processor']} does not call SDPA")
    if cfg["cfg_mode"] == "split" and not cfg_active:
        refuse("cfg_mode", "guidance_scale <= 1: no classifier-free guidance batch to split")
    if cfg["tf32_matmul"] and cfg["dtype"] != "float32":
        refuse("tf32_matmul", f"only affects float32 matmuls, dtype is {cfg['dtype']}")
    if head_dims is not None:
        why = attention_refusal(cfg["sdpa_backend"], device, cfg["dtype"], head_dims, capability)
        if why:
            refuse("sdpa_backend", f"{cfg['sdpa_backend']}: {why}")


def denoiser_of(pipe: Any) -> Any:
    """The pipeline's denoiser: its UNet or its transformer."""
    den = getattr(pipe, "unet", None)
    return den if den is not None else pipe.transformer


def _split_forward(forward: Any) -> Any:
    """``forward`` called on each half of the batch (CFG's two branches), outputs concatenated."""

    def split(*args: Any, **kwargs: Any) -> Any:
        batch = next(a.shape[0] for a in list(args) + list(kwargs.values()) if torch.is_tensor(a) and a.dim() > 0)
        if batch % 2:
            return forward(*args, **kwargs)
        half = batch // 2

        def part(x: Any, i: int) -> Any:
            return x[i * half:(i + 1) * half] if torch.is_tensor(x) and x.dim() > 0 and x.shape[0] == batch else x

        outs = [forward(*[part(a, i) for a in args], **{k: part(v, i) for k, v in kwargs.items()}) for i in (0, 1)]
        first = [o[0] if isinstance(o, tuple) else o.sample for o in outs]
        return (torch.cat(first, 0),)

    return split


def apply_knobs(pipe: Any, cfg: Mapping[str, Any], family: str) -> dict[str, Any]:
    """Change ``pipe`` in place for ``cfg`` (dtype was applied when it was built); notes of what changed."""
    notes: dict[str, Any] = {}
    den = denoiser_of(pipe)
    if cfg["attn_processor"] == "classic":
        from diffusers.models.attention_processor import AttnProcessor

        den.set_attn_processor(AttnProcessor())
        notes["attn_processor"] = "AttnProcessor (classic) on the UNet"
    if cfg["fuse_qkv"]:
        den.fuse_qkv_projections()
        pipe.vae.fuse_qkv_projections()
        notes["fuse_qkv"] = "fuse_qkv_projections() of the denoiser and the VAE"
    if cfg["channels_last"]:
        if family == "unet":
            den.to(memory_format=torch.channels_last)
        pipe.vae.to(memory_format=torch.channels_last)
        notes["channels_last"] = "UNet and VAE" if family == "unet" else "VAE (the transformer has no convolutions)"
    if cfg["vae_slicing"]:
        pipe.vae.enable_slicing()
    if cfg["vae_tiling"]:
        pipe.vae.enable_tiling()
    if cfg["cfg_mode"] == "split":
        den.forward = _split_forward(den.forward)
        notes["cfg_mode"] = "the denoiser is called once per CFG branch"
    if cfg["rmsnorm_impl"] != "eager":
        notes["rmsnorm_impl"] = apply_rmsnorm_impl(den, cfg["rmsnorm_impl"])
    if cfg.get("llm_kernel", "none") != "none":  # only in a session with the LLM kernel author
        notes["llm_kernel"] = apply_written_norms(eager_rmsnorms(den), cfg["llm_kernel"], "eps")
    if cfg["compile_mode"] != "off":
        den.compile(mode=cfg["compile_mode"], fullgraph=False, dynamic=False)
        notes["compile"] = f"denoiser.compile(mode={cfg['compile_mode']}, dynamic=False)"
    return notes


@contextlib.contextmanager
def call_state(cfg: Mapping[str, Any], device: str) -> Iterator[None]:
    """Threads, TF32 and the forced SDPA kernel for the duration of a call; restored afterwards."""
    threads = torch.get_num_threads()
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        if device == "cpu":
            torch.set_num_threads(int(cfg["cpu_threads"]))
        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = bool(cfg["tf32_matmul"])
        with contextlib.ExitStack() as stack:
            if cfg["sdpa_backend"] != "auto":
                from torch.nn.attention import SDPBackend, sdpa_kernel

                names = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                         "cudnn": "CUDNN_ATTENTION"}
                stack.enter_context(sdpa_kernel(getattr(SDPBackend, names[cfg["sdpa_backend"]])))
            yield
    finally:
        torch.set_num_threads(threads)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
