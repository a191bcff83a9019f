"""The SGLang server's command line and its memory share.

* :func:`launch_command`: ``<serving.python> -m sglang.launch_server --model-path M --served-model-name
  inferloom-model --host 127.0.0.1 --port P --random-seed S --context-length L``, the spec's
  ``serving.extra_args`` and the knob flags (``sglang_knobs.to_launch``), with ``origin`` tracing each flag
  to its knob; ``SGLANG_LOG_MS=1`` so the log's timestamps carry milliseconds (``sglang_startup``).
* :func:`derive_memory_share` / :func:`memory_args`: each server's share of the device's free memory
  (``memory_share.gpu_share``, as for vLLM) given through SGLang's own flags. SGLang sizes its KV pool
  from the memory free *at its own start*: ``pool = free * mem_fraction_static - weights``
  (``kv_cache_configurator._profile_available_bytes``, SGLang 0.5.17), so the second server of a pair,
  which starts with the first one's share already taken, would get a smaller pool at the same fraction.
  Each server therefore gets ``--max-total-tokens`` (the share's KV bytes in tokens: the same capacity for
  both) and a ``--mem-fraction-static`` that leaves that pool room on the second start too.
* :func:`server_distribution`: the SGLang distribution installed in the server's environment.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection, Mapping

from inferloom.workloads.memory_share import MemoryShare, gpu_index, gpu_memory, gpu_share, kv_bytes_per_token, weight_bytes
from inferloom.workloads.server_launch import SERVED_NAME, max_model_len
from inferloom.workloads.sglang_knobs import to_launch

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["TOP_K", "MODULE", "launch_command", "derive_memory_share", "memory_args", "mem_fraction",
           "server_distribution"]

TOP_K = 20  # prompt log-probabilities per position (top_logprobs_num), as for vLLM
MODULE = "sglang.launch_server"
MEMORY_FLAGS = ("--mem-fraction-static", "--max-total-tokens")


def launch_command(spec: WorkloadSpec, model_dir: str, cfg: Mapping[str, Any], port: int,
                   server_flags: Collection[str] | None = None,
                   longest: int = 0) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    """``(argv, env, origin)`` of the server for configuration ``cfg`` on ``port``."""
    s = spec.serving
    args, env_k, origin = to_launch(cfg, server_flags)
    argv = [s.python, "-m", s.module, "--model-path", model_dir, "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1", "--port", str(port), "--random-seed", str(spec.seed),
            "--context-length", str(max_model_len(spec, longest)), *s.extra_args, *args]
    env = dict(os.environ)
    env.setdefault("SGLANG_LOG_MS", "1")
    env.update(s.env)
    env.update(env_k)
    env.pop("PYTHONPATH", None)  # the server's environment is its own
    return argv, env, origin


def _spec_sets(spec: WorkloadSpec, flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in spec.serving.extra_args)


def derive_memory_share(spec: WorkloadSpec, device: str, model_dir: str, servers: int = 2) -> MemoryShare | None:
    """Each of ``servers``' share of the GPU's free memory now (None on CPU, or when the spec sets every
    memory flag itself); MemoryShareError when they don't fit."""
    if device == "cpu" or all(_spec_sets(spec, f) for f in MEMORY_FLAGS):
        return None
    free, total, src = gpu_memory(gpu_index())
    return gpu_share(free, total, weight_bytes(model_dir), servers, src)


def mem_fraction(share: MemoryShare) -> float:
    """``--mem-fraction-static`` for each server of ``share``: weights plus the share's KV pool, as a fraction
    of the memory free when the *last* server of the pair starts (the others' shares already taken), rounded
    up to a thousandth, at most 0.95."""
    free_last = share.free_bytes - (share.servers - 1) * share.per_server_bytes
    need = share.weight_bytes + share.kv_cache_bytes
    return min(0.95, -(-need * 1000 // max(free_last, 1)) / 1000)


def _kv_tokens(model_dir: str, share: MemoryShare, cfg: Mapping[str, Any], dtype: str) -> int | None:
    kv = str(cfg.get("kv_cache_dtype", "auto"))
    nbytes = 1 if kv.startswith("fp8") else (4 if dtype == "float32" else 2)
    try:
        per = kv_bytes_per_token(json.loads((Path(model_dir) / "config.json").read_text()), nbytes)
    except (OSError, ValueError):
        return None
    return int(share.kv_cache_bytes // per) if per else None


def memory_args(spec: WorkloadSpec, cfg: Mapping[str, Any], share: Any, server_flags: Collection[str] | None,
                device: str, model_dir: str | None = None) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """``(args, env, decided)``: the derived ``share``'s flags for one launch; ``decided`` says for each
    memory flag where its value came from (``spec``, ``knob``, ``derived``, or why none)."""
    args: list[str] = []
    decided: dict[str, str] = {}
    own = cfg.get("mem_fraction_static", "default") != "default"
    tokens = _kv_tokens(model_dir, share, cfg, spec.dtype) if share is not None and model_dir else None
    for flag in MEMORY_FLAGS:
        if _spec_sets(spec, flag):
            decided[flag] = "spec"
        elif device == "cpu":
            decided[flag] = "not derived on cpu (SGLang's own default)"
        elif own:
            decided[flag] = f"knob mem_fraction_static: {cfg['mem_fraction_static']}"
        elif share is None:
            decided[flag] = "not derived"
        elif server_flags is not None and flag not in server_flags:
            decided[flag] = "the installed server lacks it"
        elif flag == "--mem-fraction-static":
            value = mem_fraction(share)
            args += [flag, str(value)]
            decided[flag] = f"derived: {value}"
        elif tokens is None:
            decided[flag] = "no KV bytes per token from the model's config.json"
        else:
            args += [flag, str(tokens)]
            decided[flag] = f"derived: {tokens} tokens ({share.kv_cache_bytes} bytes)"
    return args, {}, decided


def server_distribution(python: str) -> str:
    """``"sglang <version>"`` in the server's environment."""
    try:
        ver = subprocess.run([python, "-c", "import importlib.metadata as m\ntry: print('sglang', m.version('sglang'))"
                              "\nexcept Exception: pass"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        ver = f"unknown ({type(exc).__name__})"
    return ver or "not found in the server's environment"
