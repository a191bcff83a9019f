"""The in-process diffusers engine: a text-to-image pipeline on one device.

One :class:`DiffusersEngine` serves one :class:`~inferloom.spec.WorkloadSpec`
with ``framework: diffusers``; its ``diffusion`` section fixes what defines
the output (resolution, steps, guidance, scheduler, batch size, prompts) and
every timed run draws its prompts and noise seeds from the run's seed.
Each prepared configuration builds its own pipeline (a preset's weights are
a pure function of the spec's seed: see
:mod:`inferloom.models.diffusion_presets`).

Objective: images per second (:class:`~inferloom.workloads.base.OwnObjective`);
a run's ``output_tokens`` counts the images it produced, so the generic
"output units per second" metric is images/s too. Warm-up runs (compilation,
CUDA-graph capture) are never timed: :mod:`inferloom.measure.compare` does them.

The initial noise of every image is drawn here in float32 on the CPU from its
own seed and cast to the configuration's dtype, so stock and candidate denoise
the same noise; the quality probe (:meth:`DiffusersEngine.generate_images`,
the :class:`~inferloom.workloads.base.ImageOutputs` hook) also records the
latents after each step. Knobs: :mod:`inferloom.workloads.diffusers_knobs`.
"""

from __future__ import annotations

import gc
import itertools
import os
import platform
import random
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from inferloom.models.diffusion_presets import (
    DIFFUSION_PRESETS,
    SCHEDULERS,
    build_pipeline,
    pipeline_info,
    preset_family,
    uses_cfg_batch,
)
from inferloom.models.presets import parse_dtype
from inferloom.provenance import cpu_model
from inferloom.spec import WorkloadSpec
from inferloom.workloads.base import AdapterError, ConfigError, Knob, RunRecord, config_key, resolve_config
from inferloom.workloads.diffusers_attention import attention_head_dims, cuda_capability
from inferloom.workloads.diffusers_knobs import apply_knobs, call_state, check_applicable, denoiser_of, diffusers_knobs
from inferloom.workloads.diffusers_ops import rmsnorm_rule, written_rule
from inferloom.workloads.engine_written import knob as written_knob
from inferloom.workloads.prompts import load_jsonl_texts
from inferloom.workloads.transformers_generation import error_kind, sync

__all__ = ["DiffusersEngine", "DiffusersHandle"]


@dataclass
class DiffusersHandle:
    id: str
    config: dict[str, Any]
    config_id: str
    pipe: Any
    model: Any  # the denoiser (the profiler labels its modules)
    device: str
    dtype: Any
    prepare_s: float
    notes: dict[str, Any] = field(default_factory=dict)
    released: bool = False


class DiffusersEngine:
    """WorkloadAdapter for a diffusers text-to-image pipeline in this process."""

    name = "diffusers"

    def __init__(self, spec: WorkloadSpec) -> None:
        if spec.diffusion is None:
            raise ConfigError("framework diffusers needs a 'diffusion' section")
        self.spec = spec
        self.d = spec.diffusion
        self.device = spec.resolved_device()
        if self.device == "cuda" and not torch.cuda.is_available():
            raise AdapterError("spec device 'cuda': no CUDA device is available", kind="unsupported")
        self.family = preset_family(spec.model)
        if self.d.scheduler not in SCHEDULERS[self.family]:
            raise ConfigError(f"diffusion.scheduler: {self.d.scheduler!r} is not a {self.family} scheduler; expected "
                              "one of " + ", ".join(sorted(SCHEDULERS[self.family])))
        self.texts = load_jsonl_texts(self.d.prompts_file) if self.d.prompts_file else list(self.d.prompts)
        self._startup_threads = torch.get_num_threads()
        self._knobs: list[Knob] | None = None
        self._handles: dict[str, DiffusersHandle] = {}
        self._counter = itertools.count(1)
        _quiet()

    # ------------------------------------------------------------------ knobs
    def knob_space(self) -> list[Knob]:
        if self._knobs is None:
            self._knobs = diffusers_knobs(self.spec.dtype, self.family, self._startup_threads)
        llm = self.spec.agents.llm  # the LLM kernel author's switch (kernels/written.py), as in transformers
        return list(self._knobs) + ([written_knob()] if llm is not None and "kernel_author" in llm.roles else [])

    # ---------------------------------------------------------------- prompts
    def draw(self, seed: int, n: int) -> list[list[int]]:
        """``n`` items ``[prompt_index, noise_seed]`` drawn from ``seed``."""
        rng = random.Random(seed)
        return [[rng.randrange(len(self.texts)), rng.randrange(2**31 - 1)] for _ in range(n)]

    def prompts(self, seed: int, n: int, length: int) -> list[list[int]]:
        """The token-level view of ``n`` drawn prompts: each text's UTF-8 bytes, repeated to ``length``."""
        out = []
        for idx, _ in self.draw(seed, n):
            b = list(self.texts[idx].encode("utf-8"))
            out.append((b * (length // len(b) + 1))[:length])
        return out

    # ------------------------------------------------------------ knob rules
    def _check(self, cfg: Mapping[str, Any]) -> None:
        """The knobs' rules, then a forced SDPA kernel against every attention's head dim (read off the
        components' configs, nothing built): refused up front, not at the first call."""
        forced = self.device == "cuda" and cfg["sdpa_backend"] not in ("auto", "math")
        check_applicable(self.knob_space(), cfg, self.device, self.family,
                         uses_cfg_batch(self.family, self.d.guidance_scale),
                         head_dims=attention_head_dims(self.spec.model) if forced else None,
                         capability=cuda_capability() if forced else None)
        why = rmsnorm_rule(cfg, self.spec.model, self.device)
        if why:
            raise AdapterError(f"knob 'rmsnorm_impl': {why}", kind="unsupported")
        why = written_rule(cfg, self.spec.model)
        if why:
            raise AdapterError(f"knob 'llm_kernel': {why}", kind="unsupported")

    def config_refusal(self, config: Mapping[str, Any]) -> str | None:
        """Why ``prepare`` would refuse ``config`` by the knobs' rules, else None (CrossKnobRules)."""
        try:
            self._check({**{k.name: k.default for k in self.knob_space()}, **config})
        except AdapterError as exc:
            return str(exc)
        return None

    # ---------------------------------------------------------------- prepare
    def prepare(self, config: Mapping[str, Any]) -> DiffusersHandle:
        cfg = resolve_config(self.knob_space(), config, self.spec.pinned)
        self._check(cfg)
        t0 = time.perf_counter()
        dtype = parse_dtype(cfg["dtype"])
        try:
            pipe = build_pipeline(self.spec.model, dtype, self.device, self.spec.seed, self.d.scheduler)
            notes = apply_knobs(pipe, cfg, self.family)
        except Exception as exc:
            self._free()
            kind = error_kind(exc)
            raise AdapterError(f"building the pipeline for {config_key(cfg)} failed: {type(exc).__name__}: {exc}",
                               kind=kind if kind == "oom" else "unsupported") from exc
        h = DiffusersHandle(id=f"{self.name}-{next(self._counter)}", config=cfg, config_id=config_key(cfg), pipe=pipe,
                            model=denoiser_of(pipe), device=self.device, dtype=dtype,
                            prepare_s=time.perf_counter() - t0, notes=notes)
        self._handles[h.id] = h
        return h

    # -------------------------------------------------------------------- run
    def _noise(self, h: DiffusersHandle, seeds: list[int]) -> torch.Tensor:
        pipe = h.pipe
        den = denoiser_of(pipe)
        ch = int(den.config.in_channels)
        f = int(pipe.vae_scale_factor)
        hh, ww = self.d.height // f, self.d.width // f
        if self.family == "flux":  # noise of the VAE's latent channels, packed into 2x2 patches (FluxPipeline's)
            ch, hh, ww = ch // 4, 2 * (self.d.height // (2 * f)), 2 * (self.d.width // (2 * f))
        lat = torch.stack([torch.randn((ch, hh, ww), generator=torch.Generator("cpu").manual_seed(s),
                                       dtype=torch.float32) for s in seeds])
        if self.family == "flux":
            lat = pipe._pack_latents(lat, len(seeds), ch, hh, ww)
        return lat.to(device=self.device, dtype=h.dtype)

    def _call(self, h: DiffusersHandle, items: list[list[int]], output_type: str = "np", callback: Any = None) -> Any:
        d = self.d
        kwargs: dict[str, Any] = dict(DIFFUSION_PRESETS.get(self.spec.model, {}).get("call", {}))
        if callback is not None:
            kwargs.update(callback_on_step_end=callback, callback_on_step_end_tensor_inputs=["latents"])
        return h.pipe(prompt=[self.texts[i] for i, _ in items], negative_prompt=[d.negative_prompt] * len(items),
                      height=d.height, width=d.width, num_inference_steps=d.steps, guidance_scale=d.guidance_scale,
                      latents=self._noise(h, [s for _, s in items]), output_type=output_type, **kwargs)

    def run(self, handle: DiffusersHandle, seed: int) -> RunRecord:
        d = self.d
        n = d.images_per_run
        rec = RunRecord(config_id=handle.config_id, seed=seed, success=False, started_at=time.time(), num_requests=n,
                        expected_output_tokens=n, extra={"handle_id": handle.id, "batch_size": d.batch_size,
                                                         "steps": d.steps, "unit": "images"})
        if handle.released:
            rec.error = "error: handle was released"
            return rec
        try:
            items = self.draw(seed, n)
            batches = [items[i:i + d.batch_size] for i in range(0, n, d.batch_size)]
            with call_state(handle.config, self.device), torch.inference_mode():
                sync(self.device)
                t0 = time.perf_counter()
                for b in batches:
                    tb = time.perf_counter()
                    out = self._call(handle, b)
                    sync(self.device)
                    made = int(out.images.shape[0])
                    rec.batches.append({"size": len(b), "wall_s": time.perf_counter() - tb, "output_tokens": made})
                    rec.output_tokens += made
                rec.wall_s = time.perf_counter() - t0
            if rec.output_tokens != n:
                raise RuntimeError(f"produced {rec.output_tokens} images, expected {n}")
            rec.extra["images"] = rec.output_tokens
            rec.extra["s_per_image"] = rec.wall_s / n
            rec.success = True
        except Exception as exc:  # failures are data
            kind = error_kind(exc)
            first = (str(exc).strip().splitlines() or [""])[0]
            rec.error = f"{kind}: {type(exc).__name__}: {first}"[:2000]
            rec.extra["kind"] = kind
            if kind == "oom":
                self._free()
        return rec

    def objective_metric(self, rec: RunRecord) -> float:
        """Images per second of one successful run."""
        if not rec.success or rec.wall_s <= 0:
            raise ValueError(f"run {rec.seed} failed or has no wall time: {rec.error}")
        return rec.output_tokens / rec.wall_s

    # ---------------------------------------------------------------- quality
    def generate_images(self, handle: DiffusersHandle, items: list[list[int]]) -> dict[str, Any]:
        """Final latents, per-step latents and decoded images of ``items`` (see ImageOutputs)."""
        lat, traj, imgs = [], [], []
        for i in range(0, len(items), self.d.batch_size):
            steps: list[torch.Tensor] = []

            def keep(_pipe: Any, _i: int, _t: Any, kw: dict[str, Any]) -> dict[str, Any]:
                steps.append(kw["latents"].detach().float().cpu())
                return kw

            with call_state(handle.config, self.device), torch.inference_mode():
                out = self._call(handle, items[i:i + self.d.batch_size], callback=keep)
            imgs.append(torch.from_numpy(out.images).float())
            lat.append(steps[-1])
            traj.append(torch.stack(steps, 1))
        return {"latents": torch.cat(lat), "trajectory": torch.cat(traj), "images": torch.cat(imgs)}

    def greedy(self, handle: Any, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        raise AdapterError("an image pipeline has no token probes; its quality contract compares images "
                           "(generate_images)", kind="unsupported")

    def score(self, handle: Any, prompts: list[list[int]], continuations: list[list[int]]) -> Any:
        raise AdapterError("an image pipeline has no token probes; its quality contract compares images "
                           "(generate_images)", kind="unsupported")

    # --------------------------------------------------------------- describe
    def describe(self) -> dict[str, Any]:
        import diffusers

        d = self.d
        return {
            "framework": "diffusers", "adapter": self.name, "diffusers_version": diffusers.__version__,
            "torch_version": torch.__version__, "cuda_version": torch.version.cuda,
            "python_version": platform.python_version(), "device": self.device,
            "device_name": torch.cuda.get_device_name(0) if self.device == "cuda" else cpu_model(),
            "cpu_count": os.cpu_count(), "startup_threads": self._startup_threads, "model": self.spec.model,
            "model_info": pipeline_info(self.spec.model),
            "dtype": self.spec.dtype,
            "workload": {"height": d.height, "width": d.width, "steps": d.steps, "guidance_scale": d.guidance_scale,
                         "scheduler": d.scheduler, "batch_size": d.batch_size, "images_per_run": d.images_per_run},
        }

    # ---------------------------------------------------------------- release
    def _free(self) -> None:
        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()

    def release(self, handle: DiffusersHandle) -> None:
        if handle.released:
            return
        handle.released = True
        self._handles.pop(handle.id, None)
        handle.pipe = handle.model = None
        if handle.config.get("compile_mode", "off") != "off" and not any(
                h.config.get("compile_mode", "off") != "off" for h in self._handles.values()):
            torch._dynamo.reset()  # compiled graphs hold the weights; no live configuration needs them
        self._free()

    def close(self) -> None:
        for h in list(self._handles.values()):
            self.release(h)


def _quiet() -> None:
    """diffusers' and transformers' deprecation chatter would drown the progress lines."""
    import diffusers
    import transformers

    diffusers.utils.logging.set_verbosity_error()
    transformers.logging.set_verbosity_error()
