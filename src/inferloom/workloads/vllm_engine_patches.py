"""The knob ``engine_patch``: which user-supplied engine diff (``serving.engine_patches``) a vLLM server starts
with, as a source overlay (``vllm_source_overlay``: a copy-on-write symlink farm of the installed package with
the patched files as real files, first on the server's ``PYTHONPATH``), and the checks and ranking around it.

* :func:`patch_files` / :func:`engine_patch_knob`: the directory's ``.patch`` / ``.diff`` files in name order;
  the knob's values are their names (file stems) and ``none`` (the default: no overlay). ``phase: PATCH``:
  only the session's engine-patch step proposes it, after the gates (parse, policy, critic, the isolated
  copy); the configuration search never does.
* :func:`build_engine_overlay`: the overlay for one patch, its record carrying ``knob: {engine_patch: name}``
  and the patch's sha256 (content-addressed: the same patch on the same installed files is the same directory).
* :func:`rank_patches`: the order the session tries them. With a profile of the server (category -> share,
  ``measure/server_profile.py``'s categories), each patch is scored by the summed share of the categories its
  files feed (:data:`FILE_CATEGORIES`, a coarse file -> category map: ``layernorm.py`` normalization,
  ``linear.py`` and quantization GEMM, attention backends attention, the engine loop, scheduler, worker and
  API server host time (``idle``), a model file every device category it runs); the highest first, file
  order among equals, a file the map does not know scoring nothing. Without a profile: file order, and the
  session's ledger says so.
* :func:`recorded_source` / :func:`check_engine_overlays` (``Framework.session_overlays``, ``verify
  --remeasure``): the final stack's source overlay, its session copy checked file by file against the sha256 its
  server start recorded, then rebuilt from the patch text the session's ledger holds (its sha256 checked
  against the record) on the installed package the record names, and compared digest for digest; the kernel
  plugin's overlay is checked as before (``vllm_kernel_overlays``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from inferloom.spec.engine_patches import PATCH_SUFFIXES, patch_paths
from inferloom.workloads.base import Knob
from inferloom.workloads.vllm_kernel_overlays import check_session_overlays
from inferloom.workloads.vllm_plugins import (EngineOverlayError, OverlayDir, check_rebuilt, last_recorded,
                                              verify_overlay)
from inferloom.workloads.vllm_source_overlay import build_source_overlay

__all__ = ["ENGINE_PATCH_KNOB", "FILE_CATEGORIES", "HOST", "patch_files", "engine_patch_knob", "build_engine_overlay",
           "rank_patches", "profile_orders", "recorded_source", "check_engine_overlays", "patch_text", "rollback_check"]

ENGINE_PATCH_KNOB = "engine_patch"
HOST = "idle"  # the profile's host time: the engine loop, scheduling, the API server between kernels
_DEVICE = ("gemm", "attention", "normalization", "elementwise", "memory_copy")

#: (fnmatch pattern over the package path, the profile categories its code runs in); the first match wins
FILE_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vllm/model_executor/layers/layernorm.py", ("normalization",)),
    ("vllm/model_executor/layers/activation.py", ("elementwise",)),
    ("vllm/model_executor/layers/rotary_embedding*", ("elementwise",)),
    ("vllm/model_executor/layers/fused_moe/*", ("gemm",)),
    ("vllm/model_executor/layers/linear.py", ("gemm",)),
    ("vllm/model_executor/layers/quantization/*", ("gemm",)),
    ("vllm/model_executor/layers/vocab_parallel_embedding.py", ("gemm",)),
    ("vllm/attention/*", ("attention",)),
    ("vllm/v1/attention/*", ("attention",)),
    ("vllm/model_executor/layers/attention*", ("attention",)),
    ("vllm/distributed/*", ("communication",)),
    ("vllm/model_executor/models/*", _DEVICE),
    ("vllm/v1/engine/*", (HOST,)),
    ("vllm/v1/core/*", (HOST,)),
    ("vllm/v1/worker/*", (HOST, "memory_copy")),
    ("vllm/v1/sample/*", (HOST, "elementwise")),
    ("vllm/entrypoints/*", (HOST,)),
)


def patch_files(directory: str | Path | None) -> dict[str, Path]:
    """name (file stem) -> file, in file-name order; {} for no directory."""
    if not directory or not Path(directory).is_dir():
        return {}
    out: dict[str, Path] = {}
    for p in sorted(Path(directory).iterdir()):
        if p.suffix in PATCH_SUFFIXES and p.is_file() and not p.name.startswith("."):
            out.setdefault(p.stem, p)
    return out


def engine_patch_knob(names: Sequence[str]) -> Knob:
    return Knob(ENGINE_PATCH_KNOB, "choice", "none",
                "an engine source patch from serving.engine_patches, applied to a copy-on-write overlay of the "
                "installed vllm package first on the server's PYTHONPATH (never to the environment): "
                + (", ".join(names) or "none given"),
                choices=("none", *names), applies_to=frozenset({"cpu", "cuda", "rocm"}), changes_numerics=True,
                phase="PATCH")


def build_engine_overlay(root: str | Path, package_dir: str | Path, name: str, data: bytes,
                         patch_file: str | Path | None = None) -> OverlayDir:
    """The source overlay of patch ``name`` (its bytes ``data``, read from ``patch_file``) under ``root``;
    PatchRefusal with the gate's rule (``malformed_diff``, ``outside_allowlist``, ``does_not_apply``, ...) when
    it can't be built."""
    ov = build_source_overlay(root, package_dir, data)
    return dataclasses.replace(ov, info={**ov.info, "knob": {ENGINE_PATCH_KNOB: name},
                                         "patch_file_sha256": hashlib.sha256(data).hexdigest(),
                                         "patch_file": None if patch_file is None else str(patch_file)})


def _categories(path: str) -> tuple[str, ...]:
    return next((cats for pat, cats in FILE_CATEGORIES if fnmatch.fnmatchcase(path, pat)), ())


def profile_orders(directory: str | Path | None) -> int:
    """How many of the directory's patches a profile could order: 0 unless at least two distinct sets of
    categories are touched (patches whose files all run in the same categories, or in none the map knows, keep
    file order whatever the profile says, so no server start is spent on one)."""
    sets: dict[tuple[str, ...], int] = {}
    for path in patch_files(directory).values():
        try:
            paths = patch_paths(path.read_text(errors="replace"))
        except OSError:
            continue
        cats = tuple(sorted({c for p in paths for c in _categories(p)}))
        if cats:
            sets[cats] = sets.get(cats, 0) + 1
    return sum(sets.values()) if len(sets) >= 2 else 0


def rank_patches(touched: Mapping[str, Sequence[str]], shares: Mapping[str, float] | None) -> tuple[list[dict[str, Any]], str]:
    """``(order, how)``: each patch (``touched``: name -> the paths it changes, in file order) with its score and
    the categories it was scored by; ``shares``: the server profile's category -> share (None or empty: file
    order). See the module docstring."""
    rows = []
    for i, (name, paths) in enumerate(touched.items()):
        cats = sorted({c for p in paths for c in _categories(p)})
        score = sum(float(shares.get(c, 0.0)) for c in cats) if shares else None
        rows.append({"id": name, "file_order": i + 1, "paths": list(paths), "categories": cats, "share": score})
    if not shares:
        return rows, "file order: the session has no profile of the server to rank the patches by"
    rows.sort(key=lambda r: (-float(r["share"] or 0.0), r["file_order"]))
    return rows, ("by the server profile's share of the categories each patch's files run in (a coarse file -> "
                  "category map, FILE_CATEGORIES; a file it does not know scores nothing); file order among equals")


def _recorded(value: str, entries: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    return last_recorded(entries, "source", ENGINE_PATCH_KNOB, value)


def recorded_source(cfg: Mapping[str, Any], entries: Iterable[Mapping[str, Any]]) -> OverlayDir | None:
    """The source overlay a server start of the session recorded for ``cfg``'s ``engine_patch`` (its recorded
    path), or None (``none``, or no start recorded it)."""
    value = str(cfg.get(ENGINE_PATCH_KNOB, "none"))
    rec = None if value == "none" else _recorded(value, entries)
    if rec is None:
        return None
    return OverlayDir("source", Path(str(rec["path"])), str(rec["digest"]), dict(rec.get("files") or {}))


def rollback_check(overlay: Mapping[str, Any], stock_key: str, starts: Iterable[Mapping[str, Any]]) -> tuple[bool, str]:
    """The rollback drill's check of a kept patch's overlay (its record: ``package_dir``, ``base``): every
    server start of the stock configuration (``stock_key``; ``starts``: the session's ``server_start`` entries)
    carried no source overlay, and the installed files the patch was built on still have the sha256 the
    overlay recorded (the environment was only read). ``(passed, why)``."""
    stock = [e for e in starts if e.get("config") == stock_key]
    if any(o.get("kind") == "source" for e in stock for o in e.get("overlays") or ()):
        return False, "a stock server started with a source overlay"
    site = Path(str(overlay.get("package_dir"))).parent
    base = dict(overlay.get("base") or {})
    if not base:
        return False, "the overlay's record names no installed file it was built on"
    for rel, sha in base.items():
        try:
            got = hashlib.sha256((site / rel).read_bytes()).hexdigest()
        except OSError:
            got = "missing"
        if got != sha:
            return False, f"the installed {rel} changed during the session (sha256 {got[:12]}, recorded {sha[:12]})"
    said = (f"{len(stock)} stock server start(s), none with the overlay" if stock else
            "no server start recorded (the engine records none)")
    return True, f"{said}; the installed {', '.join(base)} unchanged (sha256)"


def patch_text(value: str, entries: Iterable[Mapping[str, Any]]) -> str | None:
    """The text of patch ``value`` as the session's ledger holds it (its proposal entry)."""
    text = None
    for e in entries:
        if e.get("kind") == "proposal" and (e.get("changes") or {}).get(ENGINE_PATCH_KNOB) == value and e.get("text"):
            text = str(e["text"])
    return text


def check_engine_overlays(d: str | Path, changes: Mapping[str, Any],
                          entries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """See the module docstring; ``entries``: the session's ledger entries. Returns what was checked."""
    entries = list(entries)
    out = check_session_overlays(d, changes, entries)
    value = str(changes.get(ENGINE_PATCH_KNOB, "none"))
    if value == "none":
        return out
    d = Path(d)
    rec = _recorded(value, entries)
    if rec is None:
        raise EngineOverlayError(f"{d}: no server start of the session recorded the source overlay of "
                                 f"{ENGINE_PATCH_KNOB}={value}; the session's files can't show which engine ran")
    text = patch_text(value, entries)
    if text is None or hashlib.sha256(text.encode()).hexdigest() != rec.get("patch_file_sha256"):
        raise EngineOverlayError(f"{d}: the ledger holds no text of patch {value} with the sha256 its overlay "
                                 f"recorded ({str(rec.get('patch_file_sha256'))[:12]}); it can't be rebuilt")
    pfile = Path(str(rec["patch_file"])) if rec.get("patch_file") else None
    if pfile is not None and pfile.is_file() and hashlib.sha256(pfile.read_bytes()).hexdigest() != rec["patch_file_sha256"]:
        raise EngineOverlayError(f"{pfile} changed since the session measured it (sha256 recorded "
                                 f"{str(rec['patch_file_sha256'])[:12]}); a re-measurement would start another "
                                 "patch: restore the file (the session's text is in its ledger and export)")
    name = Path(str(rec["path"])).name
    copies = sorted(p for p in d.rglob(name) if p.is_dir())
    if not copies:
        raise EngineOverlayError(f"{d}: the session's source overlay {name} ({ENGINE_PATCH_KNOB}={value}) is missing")
    for c in copies:
        verify_overlay(OverlayDir("source", c, str(rec["digest"]), dict(rec.get("files") or {})))
    with tempfile.TemporaryDirectory(prefix="inferloom-overlay-rebuild-") as tmp:
        try:
            rebuilt = build_engine_overlay(tmp, str(rec["package_dir"]), value, text.encode())
        except Exception as exc:  # noqa: BLE001 - a refusal now (another vLLM installed) is a failed check
            raise EngineOverlayError(f"the source overlay of {ENGINE_PATCH_KNOB}={value} can't be rebuilt on "
                                     f"{rec['package_dir']}: {exc}") from None
        check_rebuilt(rebuilt, rec)
    return out + [{"knob": {ENGINE_PATCH_KNOB: value}, "digest": rebuilt.digest, "files": len(rebuilt.files),
                   "copies": [str(c.relative_to(d)) for c in copies], "patch_sha256": rec.get("patch_file_sha256")}]
