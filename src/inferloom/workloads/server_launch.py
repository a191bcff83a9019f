"""What every server framework's command line shares, and what a failed launch teaches.

* :data:`SERVED_NAME`: the model name every server is told to serve (the load generator asks for it).
* :func:`server_model_dir`: the local Hugging Face directory the server loads;
  a preset is written once (seeded random weights, built tokenizer) under the
  inferloom cache.
* :func:`max_model_len`: the context a server needs for the spec's traffic and quality probes.
* :func:`check_launchable`: refuses, before any launch, a knob set off its
  default on a device it does not apply to, or a flag the installed server
  rejected earlier in the session (``to_launch``: the framework's knob-to-flag function).
* :func:`rejected_flag_info`: the record kept for a flag the server rejected
  (its knob, value and the server's own words); :func:`log_evidence`: that line.

Used by the framework-specific launch modules (``vllm_launch``, ``sglang_launch``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

from inferloom.models.preset_dir import save_preset
from inferloom.models.presets import PRESETS
from inferloom.models.tokenizer import cache_root
from inferloom.workloads.base import AdapterError, Knob
from inferloom.workloads.server_process import LaunchError

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["SERVED_NAME", "ToLaunch", "server_model_dir", "max_model_len", "check_launchable", "rejected_flag_info",
           "log_evidence"]

SERVED_NAME = "inferloom-model"

#: a framework's ``cfg, server_flags -> (args, env, origin)``: origin maps each flag to its (knob, value)
ToLaunch = Callable[..., "tuple[list[str], dict[str, str], dict[str, tuple[str, Any]]]"]


def server_model_dir(spec: WorkloadSpec, progress: Callable[[str], None]) -> str:
    """The local HF directory the server loads; a preset is written once
    (seeded random weights, built tokenizer) under the inferloom cache."""
    if spec.model not in PRESETS:
        return spec.model
    d = cache_root() / "server-models" / f"{spec.model}-seed{spec.seed}-{spec.dtype}"
    if not (d / "config.json").is_file():
        progress(f"writing preset {spec.model} to {d} for the server")
        save_preset(spec.model, d, seed=spec.seed, dtype=spec.dtype)
    return str(d)


def max_model_len(spec: WorkloadSpec, longest: int = 0) -> int:
    """``serving.max_model_len``, else the longest traffic or quality sequence (``longest``: a trace's
    longest input + output) plus a margin, rounded up to a multiple of 64."""
    if spec.serving.max_model_len:
        return int(spec.serving.max_model_len)
    t, q = spec.traffic, spec.quality
    need = max(t.input_len + t.output_len, q.prompt_len + q.continuation_len + 1, longest) + 16
    return int(-(-need // 64) * 64)


def check_launchable(cfg: Mapping[str, Any], knobs: list[Knob], device: str,
                     rejected_flags: Mapping[str, Mapping[str, Any]], to_launch: ToLaunch) -> None:
    """Raise :class:`AdapterError` for a configuration that must not be launched."""
    for k in knobs:
        if device not in k.applies_to and cfg[k.name] != k.default:
            raise AdapterError(f"knob '{k.name}': applies only to {', '.join(sorted(k.applies_to))}, "
                               f"device is {device}", kind="unsupported")
    _, _, origin = to_launch(cfg)
    for flag, (knob, value) in origin.items():
        bad = rejected_flags.get(flag)
        if bad is not None and (bad.get("value") == value or bad.get("whole_flag")):
            raise AdapterError(f"knob '{knob}'={value!r}: the installed server rejected {flag} earlier in this "
                               f"session ({bad.get('error', '')[:200]}); not launched again",
                               kind="unsupported_flag")


def rejected_flag_info(exc: LaunchError, origin: Mapping[str, Any]) -> dict[str, Any]:
    """What is kept about ``exc.flag``: its knob and value (``whole_flag`` when
    no knob set it), the failure kind and the log line that names it."""
    knob, value = origin.get(exc.flag, (None, None))
    return {"knob": knob, "value": value, "kind": exc.kind, "error": log_evidence(exc.log_tail, exc.flag)[:300],
            "whole_flag": knob is None}


def log_evidence(log_tail: str, needle: str) -> str:
    """The log line that names ``needle`` (the server's own words), else the last line."""
    lines = [ln for ln in log_tail.splitlines() if ln.strip() and not ln.startswith("[inferloom]")]
    return next((ln for ln in reversed(lines) if needle in ln and not ln.startswith("$ ")), lines[-1] if lines else "")
