"""Provenance: what ran, where, with which versions. Written into every result."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from inferloom import __version__
from inferloom.redact import redact_env

__all__ = ["environment", "git_revision", "cpu_model", "RUN_ENV_VARS"]

# Environment variables that change how runs behave; recorded when set.
RUN_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "PYTORCH_CUDA_ALLOC_CONF",
    "TORCHINDUCTOR_CACHE_DIR",
    "TORCHINDUCTOR_FX_GRAPH_CACHE",
    "TORCH_COMPILE_DISABLE",
    "TRITON_INTERPRET",
    "TOKENIZERS_PARALLELISM",
    "HF_HUB_OFFLINE",
    "INFERLOOM_CACHE",
    "INFERLOOM_GIT_REVISION",
)


def git_revision() -> str:
    """The git revision of the inferloom source tree, with '-dirty' when modified.

    ``INFERLOOM_GIT_REVISION`` overrides it, for copies of the tree without
    their git history (a remote GPU machine, an unpacked archive)."""
    if os.environ.get("INFERLOOM_GIT_REVISION"):
        return os.environ["INFERLOOM_GIT_REVISION"]
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        )
        if rev.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here, capture_output=True, text=True, timeout=5,
        )
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    info: dict[str, Any] = {
        "name": torch.cuda.get_device_name(0),
        "count": torch.cuda.device_count(),
        "cuda": torch.version.cuda,
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
    }
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        )
        if out.returncode == 0:
            info["driver"] = out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    return info


def environment() -> dict[str, Any]:
    versions: dict[str, str] = {"inferloom": __version__, "python": sys.version.split()[0]}
    for mod in ("torch", "transformers", "tokenizers", "numpy", "scipy", "pydantic"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - a missing optional module is just absent
            pass
    return {
        "inferloom_git_revision": git_revision(),
        "versions": versions,
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpu": _gpu(),
        "env": redact_env({k: os.environ[k] for k in RUN_ENV_VARS if k in os.environ}),
    }
