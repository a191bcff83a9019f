"""Where and how a later run differs from the run a session recorded: a measurement of a session's stacks made
elsewhere or later (``inferloom engines`` on a carried session, ``verify --remeasure``) says so next to its
numbers.

* :func:`identity` / :func:`here_identity`: host, device, GPU driver and UTC day, from a manifest or from this
  machine now (as a session started here would record them: :func:`~inferloom.session.manifest.device_record`);
* :func:`machine_apart`: what differs between two identities, in words;
* :func:`env_apart`: the serving engines' own environment variables (:data:`ENGINE_ENV`; the servers inherit
  the environment, a manifest records them) set otherwise here than in a session's manifest.
"""

from __future__ import annotations

import datetime
import time
from typing import Any, Mapping

from inferloom.provenance import environment
from inferloom.session.manifest import ENGINE_ENV_PREFIXES, device_record, run_env

__all__ = ["DEVICE", "ENGINE_ENV", "identity", "here_identity", "machine_apart", "env_apart"]

DEVICE = "device (manifest device.name)"
#: the environment variables a serving engine reads (the servers inherit the session's environment)
ENGINE_ENV = ENGINE_ENV_PREFIXES


def _identity(dev: Mapping[str, Any], ts: Any) -> dict[str, Any]:
    day = (datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).date().isoformat()
           if isinstance(ts, (int, float)) else None)
    return {"host (manifest device.hostname)": dev.get("hostname"), DEVICE: dev.get("name"),
            "GPU driver (manifest device.driver)": dev.get("driver"), "day (manifest created_at, UTC)": day}


def identity(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Where and when a session ran (its manifest): host, device, GPU driver, and the UTC day it started."""
    return _identity(manifest.get("device") or {}, manifest.get("created_at"))


def here_identity() -> dict[str, Any]:
    """This machine now, as a session started here would record it."""
    return _identity(device_record(environment()), time.time())


def machine_apart(there: Mapping[str, Any], here: Mapping[str, Any], whose: str = "the session's") -> list[str]:
    """Each field of ``here`` that differs from ``there`` (both :func:`identity`), in words; empty: the same
    machine and day."""
    return [f"{k.split(' (')[0]} {here.get(k)} ({whose}: {there.get(k)})" for k in there
            if here.get(k) != there.get(k)]


def env_apart(manifest: Mapping[str, Any], name: str, here: Mapping[str, str] | None = None) -> list[str]:
    """The engines' own variables set differently ``here`` (default: this process's, as a manifest records
    them) than in the manifest of session ``name``, in words; empty: the same."""
    mine = {k: v for k, v in (run_env() if here is None else here).items() if k.startswith(ENGINE_ENV)}
    env = manifest.get("env")
    there = {k: v for k, v in env.items() if str(k).startswith(ENGINE_ENV)} if isinstance(env, Mapping) else {}
    return [f"{k}={mine.get(k, '(unset)')} ({name}'s session: {there.get(k, '(unset)')})"
            for k in sorted(set(mine) | set(there)) if mine.get(k) != there.get(k)]
