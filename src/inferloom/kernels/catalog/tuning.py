"""Shape-specialised tuning, cached per device name in a JSON file.

A cache file per device (``<cache dir>/kernel_tuning/<device slug>.json``,
cache dir ``$INFERLOOM_KERNEL_CACHE`` or ``~/.cache/inferloom``) maps
``"<entry>|<dtype>|<shape key>"`` to the config that won. :func:`lookup`
reads it (falling back to the entry's default config); :func:`autotune`
times every config of the entry's ``tune_space`` that passes the
correctness check and stores the fastest. Off CUDA nothing is timed: the
default config is returned and nothing is written.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

__all__ = ["cache_path", "device_name", "shape_key", "lookup", "store", "autotune"]

_MEMO: dict[str, dict[str, Any]] = {}


def device_name(device: str | torch.device) -> str:
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return dev.type


_PATHS: dict[tuple[str, str | None], Path] = {}


def cache_path(device: str | torch.device) -> Path:
    key = (str(device), os.environ.get("INFERLOOM_KERNEL_CACHE"))
    if key not in _PATHS:  # launchers look themselves up at every call: keep it cheap
        root = Path(key[1] or Path.home() / ".cache" / "inferloom")
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", device_name(device)).strip("_") or "device"
        _PATHS[key] = root / "kernel_tuning" / f"{slug}.json"
    return _PATHS[key]


def shape_key(entry: str, dtype: str, shape: Mapping[str, int]) -> str:
    return f"{entry}|{dtype}|" + ",".join(f"{k}={shape[k]}" for k in sorted(shape))


def _load(path: Path) -> dict[str, Any]:
    key = str(path)
    if key not in _MEMO:
        try:
            _MEMO[key] = json.loads(path.read_text())
        except (OSError, ValueError):
            _MEMO[key] = {}
    return _MEMO[key]


def lookup(entry: str, dtype: str, shape: Mapping[str, int], device: str | torch.device,
           default: Mapping[str, Any]) -> dict[str, Any]:
    """The cached config for this shape on this device, else ``default``."""
    if torch.device(device).type != "cuda":
        return dict(default)
    hit = _load(cache_path(device)).get(shape_key(entry, dtype, shape))
    return dict(hit["config"]) if hit else dict(default)


def store(entry: str, dtype: str, shape: Mapping[str, int], device: str | torch.device,
          config: Mapping[str, Any], median_us: float) -> None:
    path = cache_path(device)
    data = _load(path)
    data[shape_key(entry, dtype, shape)] = {"config": dict(config), "median_us": median_us}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)


def autotune(entry: Any, shape: Mapping[str, int], dtype: str, device: str,
             time_config: Callable[[Mapping[str, Any]], float],
             is_correct: Callable[[Mapping[str, Any]], bool]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Fastest correct config of ``entry.tune_space`` (timed by ``time_config``, in µs); stored.

    Returns the winner and one row per tried config. Off CUDA, or with an
    empty tune space, returns the default untimed.
    """
    if torch.device(device).type != "cuda" or not entry.tune_space:
        return dict(entry.default_config), []
    rows = []
    best, best_us = dict(entry.default_config), float("inf")
    for cfg in entry.tune_space:
        try:
            ok = is_correct(cfg)
            us = time_config(cfg) if ok else float("inf")
        except Exception as exc:  # a config the compiler refuses (e.g. out of shared memory)
            rows.append({"config": dict(cfg), "error": f"{type(exc).__name__}: {exc}"[:200]})
            continue
        rows.append({"config": dict(cfg), "correct": ok, "median_us": us if ok else None})
        if ok and us < best_us:
            best, best_us = dict(cfg), us
    if best_us < float("inf"):
        store(entry.name, dtype, shape, device, best, best_us)
    return best, rows
