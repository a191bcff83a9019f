"""The pin ledger: exactly what a session ran on, so that another team can rebuild it.

:func:`pin_ledger` returns a JSON-ready dict (the manifest's ``pins``):

* ``python``: version, implementation, executable, ``sys.prefix``;
* ``packages``: every distribution importable in this interpreter (``importlib.metadata``), sorted by
  name, each with ``version``, its ``installer`` and, where pip knows it, the hash of the archive it came
  from (``direct_url.json``'s ``archive_info.hash``) or its ``url`` / VCS commit; ``record_sha256`` is
  the sha256 of the distribution's ``RECORD`` (the per-file hashes pip wrote at install: one fingerprint
  of the installed files); ``files_sha256`` the same over its own files only (:func:`files_sha256`:
  pip's bookkeeping left out, so a rebuilt virtualenv's can be compared with it);
* ``torch``: version, CUDA and cuDNN versions (None when absent), ``gpu`` (name, count, capability,
  driver) from :func:`inferloom.provenance.environment`;
* ``model``: the model's files with their sha256 (a local directory), or what the model is when it has
  no files (a synthetic preset, built from its seed); a directory converted from a GGUF file
  (``inferloom.models.gguf``) adds ``source``: its marker, with the GGUF's path and ``source_sha256``;
* ``kernel_cache``: the tuned-kernel cache files (``$INFERLOOM_KERNEL_CACHE`` or ``~/.cache/inferloom``,
  ``kernel_tuning/*.json``) with their sha256 and entry counts, and how many Triton cache entries exist;
* ``server``: for a server workload, the server's python and its distribution and version (as the
  adapter read them from the server's own environment); None otherwise;
* ``spec_hash``.

Fast: a model file is hashed once; the hash is cached by (path, size, mtime) in
``$INFERLOOM_CACHE/file_hashes.json`` (default ``~/.cache/inferloom``).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

__all__ = ["pin_ledger", "packages", "files_sha256", "model_files", "kernel_cache", "file_sha256", "hash_cache_path",
           "cached_file_sha256", "SOURCE_MARKER"]

_CHUNK = 1 << 20
_MODEL_FILES_CAP = 2000  # files hashed in one model directory at most (the rest counted)
#: a model directory converted from another file (a GGUF: inferloom.models.gguf) holds this JSON: the source's sha256
SOURCE_MARKER = ".inferloom-source.json"


def hash_cache_path() -> Path:
    env = os.environ.get("INFERLOOM_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "inferloom"
    return root / "file_hashes.json"


def _load_cache() -> dict[str, Any]:
    try:
        data = json.loads(hash_cache_path().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _save_cache(cache: Mapping[str, Any]) -> None:
    path = hash_cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, sort_keys=True))
        os.replace(tmp, path)
    except OSError:  # a cache: not writable is slower, not wrong
        pass


def file_sha256(path: Path, cache: dict[str, Any] | None = None) -> str:
    """The sha256 of ``path``; with ``cache``, reused while the file's size and mtime are unchanged."""
    st = path.stat()
    key = str(path.resolve())
    stamp = [st.st_size, st.st_mtime_ns]
    if cache is not None:
        hit = cache.get(key)
        if isinstance(hit, dict) and hit.get("stamp") == stamp and isinstance(hit.get("sha256"), str):
            return hit["sha256"]
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            h.update(chunk)
    digest = h.hexdigest()
    if cache is not None:
        cache[key] = {"stamp": stamp, "sha256": digest}
    return digest


def cached_file_sha256(path: Path) -> str:
    """:func:`file_sha256` through the on-disk cache (``hash_cache_path()``), saved when it changed."""
    cache = _load_cache()
    before = dict(cache)
    digest = file_sha256(path, cache)
    if cache != before:
        _save_cache(cache)
    return digest


def _direct_url(dist: metadata.Distribution) -> dict[str, Any]:
    try:
        text = dist.read_text("direct_url.json")
        d = json.loads(text) if text else None
    except (OSError, ValueError):
        return {}
    if not isinstance(d, dict):
        return {}
    out: dict[str, Any] = {"url": d.get("url")}
    archive = d.get("archive_info")
    if isinstance(archive, dict):
        hashes = archive.get("hashes") if isinstance(archive.get("hashes"), dict) else {}
        out["archive_hash"] = archive.get("hash") or (f"sha256={hashes['sha256']}" if "sha256" in hashes else None)
    vcs = d.get("vcs_info")
    if isinstance(vcs, dict):
        out["vcs"] = {"vcs": vcs.get("vcs"), "commit_id": vcs.get("commit_id")}
    if isinstance(d.get("dir_info"), dict):
        out["editable"] = bool(d["dir_info"].get("editable"))
    return out


_BOOKKEEPING = ("INSTALLER", "REQUESTED", "RECORD", "direct_url.json")


def files_sha256(record: str) -> str:
    """The sha256 of a ``RECORD``'s lines for the distribution's own files, sorted: pip's bookkeeping
    (``INSTALLER``, ``REQUESTED``, ``direct_url.json``, ``RECORD``), compiled ``.pyc`` files and files
    outside ``site-packages`` (``../``: console scripts, whose first line names the environment's python) left
    out, so the same wheel installed twice (in another virtualenv, as a dependency or by name) hashes alike."""
    keep = []
    for line in record.splitlines():
        path = line.rsplit(",", 2)[0]
        head, _, name = path.rpartition("/")
        if (not line.strip() or path.endswith(".pyc") or path.startswith("../")
                or (head.endswith(".dist-info") and name in _BOOKKEEPING)):
            continue
        keep.append(line)
    return hashlib.sha256("\n".join(sorted(keep)).encode()).hexdigest()


def packages() -> list[dict[str, Any]]:
    """Every importable distribution, sorted by name (the first of a name on ``sys.path`` wins)."""
    seen: dict[str, dict[str, Any]] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"] if dist.metadata else None
        if not name or name.lower() in seen:
            continue
        row: dict[str, Any] = {"name": name, "version": dist.version}
        installer = (dist.read_text("INSTALLER") or "").strip()
        if installer:
            row["installer"] = installer
        record = dist.read_text("RECORD")
        if record:
            row["record_sha256"] = hashlib.sha256(record.encode()).hexdigest()
            row["files_sha256"] = files_sha256(record)
        row.update({k: v for k, v in _direct_url(dist).items() if v is not None})
        seen[name.lower()] = row
    return [seen[k] for k in sorted(seen)]


def model_files(model: str, cache: dict[str, Any] | None = None) -> dict[str, Any]:
    """The model's files and their sha256 (a local directory or file), or what it is when it has none."""
    path = Path(model).expanduser()
    if path.is_file():
        return {"kind": "file", "path": str(path.resolve()),
                "files": [{"name": path.name, "bytes": path.stat().st_size, "sha256": file_sha256(path, cache)}]}
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        rows = [{"name": p.relative_to(path).as_posix(), "bytes": p.stat().st_size, "sha256": file_sha256(p, cache)}
                for p in files[:_MODEL_FILES_CAP]]
        out: dict[str, Any] = {"kind": "directory", "path": str(path.resolve()), "files": rows}
        source = _source(path)
        if source is not None:
            out["source"] = source
        if len(files) > _MODEL_FILES_CAP:
            out["not_hashed"] = f"{len(files) - _MODEL_FILES_CAP} more file(s) past the first {_MODEL_FILES_CAP}"
        return out
    if model.startswith("custom:"):
        return {"kind": "custom", "note": "a custom workload: its source tree is pinned by its commit (adapter.source)"}
    return {"kind": "preset", "name": model,
            "note": "a synthetic preset: no files; its weights are built from the spec's seed"}


def _source(directory: Path) -> dict[str, Any] | None:
    """What a converted model directory was converted from (its :data:`SOURCE_MARKER`), or None."""
    try:
        data = json.loads((directory / SOURCE_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def kernel_cache() -> dict[str, Any]:
    """The tuned-kernel cache files (sha256, entries) and the Triton cache's entry count."""
    root = Path(os.environ.get("INFERLOOM_KERNEL_CACHE") or Path.home() / ".cache" / "inferloom") / "kernel_tuning"
    entries: list[dict[str, Any]] = []
    for p in sorted(root.glob("*.json")) if root.is_dir() else []:
        try:
            n = len(json.loads(p.read_text()))
        except (OSError, ValueError, TypeError):
            n = None
        entries.append({"file": p.name, "sha256": file_sha256(p), "entries": n})
    triton = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")
    try:
        n_triton = sum(1 for _ in triton.iterdir()) if triton.is_dir() else 0
    except OSError:
        n_triton = None
    return {"tuning_dir": str(root), "tuning": entries, "triton_cache_dir": str(triton),
            "triton_cache_entries": n_triton}


def _torch() -> dict[str, Any]:
    mod = sys.modules.get("torch")
    if mod is None:
        try:
            import torch as mod  # noqa: PLC0415 - optional: a custom or server workload may not have torch
        except ImportError:
            return {"version": None, "cuda": None, "cudnn": None}
    try:
        cudnn = mod.backends.cudnn.version() if mod.backends.cudnn.is_available() else None
    except Exception:  # noqa: BLE001 - a broken CUDA install must not stop a manifest
        cudnn = None
    return {"version": mod.__version__, "cuda": mod.version.cuda, "hip": getattr(mod.version, "hip", None),
            "cudnn": cudnn}


def pin_ledger(*, model: str, spec_hash: str, gpu: Mapping[str, Any] | None,
               adapter_description: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The pin ledger of this interpreter, ``model`` and the adapter (see the module docstring)."""
    cache = _load_cache()
    before = dict(cache)
    models = model_files(model, cache)
    if cache != before:
        _save_cache(cache)
    desc = adapter_description or {}
    server = None
    if desc.get("server_python") or desc.get("server_distribution"):
        server = {"python": desc.get("server_python"), "module": desc.get("server_module"),
                  "distribution": desc.get("server_distribution")}
    return {
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation(),
                   "executable": sys.executable, "prefix": sys.prefix},
        "packages": packages(),
        "torch": {**_torch(), "gpu": dict(gpu or {}), "driver": (gpu or {}).get("driver")},
        "model": models,
        "kernel_cache": kernel_cache(),
        "server": server,
        "spec_hash": spec_hash,
    }
