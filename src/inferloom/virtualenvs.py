"""Virtualenvs inferloom makes for itself: the environment their processes get, their creation and their pip.

Shared by ``verify --rebuild`` (``evidence/rebuild.py``: a virtualenv from a session's pins) and the enablement
ladder's rung 4 (``workloads/engine_env.py``: an alternate engine from a wheelhouse, for one candidate). Neither
ever installs into the environment inferloom runs in or the server's own: pip runs as the new virtualenv's
``python -m pip``, whose prefix is that virtualenv.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable

from inferloom.errors import InferloomError
from inferloom.redact import without_secrets

__all__ = ["venv_env", "child_env", "create_venv", "pip_install", "VenvError"]

_PIP_TAIL = 40
_NOT_INHERITED = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV")


class VenvError(InferloomError, RuntimeError):
    """``python -m venv`` failed (its output); callers turn it into their own one-line error (what to do)."""


def venv_env() -> dict[str, str]:
    """This environment less what would make another python import this inferloom (``PYTHONPATH``, ...)."""
    return {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}


def child_env() -> dict[str, str]:
    """:func:`venv_env` less the secret-named variables: what pip and a made virtualenv's python get."""
    return without_secrets(venv_env())


def create_venv(venv: Path, python: str, *, with_pip: bool = True) -> Path:
    """``python -m venv venv``; returns its python. :class:`VenvError` with the tool's output."""
    res = subprocess.run([python, "-m", "venv", *([] if with_pip else ["--without-pip"]), str(venv)],
                         capture_output=True, text=True, env=child_env())
    if res.returncode != 0:
        raise VenvError((res.stderr or res.stdout).strip()[-400:])
    return venv / "bin" / "python"


def pip_install(vpy: Path, args: list[str], progress: Callable[[str], None]) -> tuple[int, list[str]]:
    """Run the virtualenv's ``pip install ARGS``; a progress line for each package it collects or installs;
    ``(rc, its last lines)``."""
    cmd = [str(vpy), "-m", "pip", "--disable-pip-version-check", "install", "--progress-bar", "off", *args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env())
    tail: list[str] = []
    assert p.stdout is not None
    for line in p.stdout:
        line = line.rstrip()
        if not line or line.startswith("WARNING: Location"):
            continue  # pip's note on each name an extra local index lacks: noise
        tail = (tail + [line])[-_PIP_TAIL:]
        if line.startswith(("Collecting", "Processing", "Installing collected", "Successfully installed")):
            progress(f"pip: {line[:200]}")
    return p.wait(), tail
