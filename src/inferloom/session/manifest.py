"""``manifest.json``: the provenance of one optimization session.

Contract:

* :func:`build_manifest` returns a JSON-serialisable dict with
  ``schema_version``; ``inferloom`` (``version``, ``git_revision``);
  ``versions`` (python, torch, transformers and the other libraries
  :func:`inferloom.provenance.environment` records); ``device`` (``name``:
  the GPU's name, or the CPU model when no GPU is visible; ``driver``: the
  GPU driver version or None; plus the GPU details, CPU, platform, host);
  ``adapter`` (the adapter's ``describe()``); ``spec`` (the resolved spec)
  and ``spec_hash``; ``seeds``; ``env`` (the environment variables that
  affect runs and are set); ``created_at`` (unix time).
* ``env`` holds :data:`inferloom.provenance.RUN_ENV_VARS` plus any variable
  whose name starts with one of :data:`ENV_PREFIXES`, except names that look
  like credentials (:data:`inferloom.redact.SECRET_NAME_MARKERS`, :func:`inferloom.redact.is_secret_name`),
  which are never recorded; a URL's password in any value is redacted
  (``postgresql://user:***@host/db``).
* :func:`write_manifest` writes the manifest through :func:`inferloom.redact.redact`:
  no URL credential in it reaches the disk.
* :func:`write_manifest` writes it atomically and durably (same helper as
  ``state.json``); :func:`read_manifest` returns it or raises
  :class:`ManifestError` (one line: what is wrong, what to do) for a missing,
  corrupt or newer-schema file.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Mapping

from inferloom import __version__
from inferloom.errors import InferloomError
from inferloom.inputs import InputError, load_json
from inferloom.pins import pin_ledger
from inferloom.provenance import RUN_ENV_VARS, environment
from inferloom.redact import is_secret_name, redact, redact_text
from inferloom.session.atomic import remove_stale_temps, write_json_atomic
from inferloom.spec import WorkloadSpec, check_bounds, spec_hash

__all__ = [
    "MANIFEST_SCHEMA_VERSION",
    "MANIFEST_FILE",
    "ENV_PREFIXES",
    "ENGINE_ENV_PREFIXES",
    "ManifestError",
    "run_env",
    "device_record",
    "build_manifest",
    "write_manifest",
    "read_manifest",
    "manifest_spec",
]

MANIFEST_SCHEMA_VERSION = 1
MANIFEST_FILE = "manifest.json"

#: every server inherits the session's environment, so the serving engines' own variables are recorded too
#: (VLLM_USE_FLASHINFER_SAMPLER, VLLM_ATTENTION_BACKEND, SGLANG_*, FLASHINFER_*: each can change what runs)
ENGINE_ENV_PREFIXES = ("VLLM_", "SGLANG_", "SGL_", "FLASHINFER_")
ENV_PREFIXES = (
    "INFERLOOM_", "OMP_", "MKL_", "CUDA_", "PYTORCH_", "TORCH_", "TORCHINDUCTOR_",
    "TRITON_", "NCCL_", "CUBLAS_", "CUDNN_", "HIP_", "ROCR_", "HSA_", *ENGINE_ENV_PREFIXES,
)


class ManifestError(InferloomError, RuntimeError):
    """``manifest.json`` is missing, unreadable or from a newer inferloom."""


def run_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The set environment variables that can change how runs behave (no credentials:
    a secret-named variable is left out, a URL's password in a value is redacted)."""
    environ = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for name in sorted(environ):
        if is_secret_name(name):
            continue
        if name in RUN_ENV_VARS or name.startswith(ENV_PREFIXES):
            out[name] = redact_text(environ[name])
    return out


def device_record(env: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest's ``device`` from :func:`inferloom.provenance.environment`'s ``env``: the GPU's name (else
    the CPU's), its driver, and the host."""
    gpu = env.get("gpu") or {}
    return {"name": gpu.get("name") or env["cpu"], "driver": gpu.get("driver"), "gpu": gpu, "cpu": env["cpu"],
            "cpu_count": env["cpu_count"], "platform": env["platform"], "hostname": env["hostname"]}


def build_manifest(
    spec: WorkloadSpec, adapter_description: Mapping[str, Any], seeds: Mapping[str, Any]
) -> dict[str, Any]:
    """The provenance record of a session about to run ``spec`` (see module docstring)."""
    env = environment()
    gpu = env.get("gpu") or {}
    versions = dict(env["versions"])
    for mod in ("torch", "transformers"):
        versions.setdefault(mod, None)  # present as null when not installed
    return {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "created_at": time.time(),
        "inferloom": {"version": __version__, "git_revision": env["inferloom_git_revision"]},
        "versions": versions,
        "device": device_record(env),
        "adapter": dict(adapter_description),
        "spec": spec.to_dict(),
        "spec_hash": spec_hash(spec),
        "seeds": dict(seeds),
        "env": run_env(),
        "pins": pin_ledger(model=spec.model, spec_hash=spec_hash(spec), gpu=gpu,
                           adapter_description=adapter_description),
    }


def write_manifest(directory: str | os.PathLike[str], manifest: Mapping[str, Any]) -> Path:
    """Atomically write ``directory/manifest.json``; returns the path."""
    path = Path(directory) / MANIFEST_FILE
    write_json_atomic(path, redact(dict(manifest)))
    remove_stale_temps(path)
    return path


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Read ``directory/manifest.json``; :class:`ManifestError` if unusable."""
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        raise ManifestError(
            f"{path}: not found; {directory} is not a session directory (or the session never "
            "started); start one with `inferloom optimize SPEC --out DIR`"
        )
    try:
        data = load_json(path.read_bytes(), int64=False)
    except (OSError, InputError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise ManifestError(
            f"{path}: unreadable ({why}); it is only "
            "written atomically, so it was edited or the disk is damaged; restore it"
        ) from None
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: expected a JSON object, got {type(data).__name__}; restore it")
    version = data.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ManifestError(f"{path}: 'schema_version' missing or not an integer (got {version!r}); restore it")
    if version > MANIFEST_SCHEMA_VERSION:
        raise ManifestError(
            f"{path}: schema_version {version} was written by a newer inferloom (this one reads "
            f"up to {MANIFEST_SCHEMA_VERSION}); upgrade inferloom to read this session"
        )
    return data


def manifest_spec(directory: str | os.PathLike[str], manifest: Mapping[str, Any]) -> WorkloadSpec:
    """The session's spec, validated from ``manifest`` (read from ``directory``); :class:`ManifestError` if
    it is missing or no longer valid (one line: the key, what was expected)."""
    path = Path(directory) / MANIFEST_FILE
    spec = manifest.get("spec")
    if not isinstance(spec, dict):
        raise ManifestError(f"{path}: 'spec' missing or not an object; it was edited: restore it")
    try:
        check_bounds(WorkloadSpec, spec, "spec")
    except ValueError as exc:
        raise ManifestError(f"{path}: the session's spec is not valid ({exc}); restore it") from None
    return WorkloadSpec.model_validate(spec)
