"""Stock's quality references on disk: a resumed session judges against the very outputs it started with.

A server's outputs vary between instances (batch-dependent kernels), so
references captured again after a resume would be a different stock, and
capturing them costs a stock server start (80-115 s on an H200). The session
keeps them in ``quality_refs.pt`` (torch.save of plain containers; loaded with
``weights_only=True``), written atomically after each capture.

A server's log-probs are its top-k with the rest of the mass spread uniformly:
per position one value repeats across most of the vocabulary. Such a tensor is
stored sparsely and losslessly (per position the repeated value, plus the
entries that differ); a dense in-process distribution is stored as it is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from inferloom.measure.quality import Reference

__all__ = ["FILE", "encode_logprobs", "decode_logprobs", "save_references", "load_references"]

FILE = "quality_refs.pt"
SPARSE_MAX_FRACTION = 0.25  # stored sparsely when at most this share of entries differ from their row's fill
DENSE_MAX_BYTES = 4 << 20   # a larger dense set is not stored: an in-process engine recaptures identical ones


def encode_logprobs(lp: Any) -> dict[str, Any]:
    """``{"dense": t}`` or ``{"shape", "fill", "idx", "vals"}`` (lossless either way)."""
    import torch

    t = lp.detach().to("cpu", torch.float32)
    if t.dim() != 3 or t.numel() == 0:
        return {"dense": t}
    fill = t.mode(dim=-1).values                      # [n, T]: the value repeated across the vocabulary
    mask = t != fill.unsqueeze(-1)
    if int(mask.sum()) > SPARSE_MAX_FRACTION * t.numel():
        return {"dense": t}
    return {"shape": list(t.shape), "fill": fill, "idx": mask.nonzero(), "vals": t[mask]}


def decode_logprobs(enc: Mapping[str, Any]) -> Any:
    import torch

    if "dense" in enc:
        return enc["dense"]
    n, T, V = enc["shape"]
    out = enc["fill"].unsqueeze(-1).expand(n, T, V).clone()
    idx = enc["idx"]
    out[idx[:, 0], idx[:, 1], idx[:, 2]] = enc["vals"]
    return out


def _key(config: Mapping[str, Any]) -> str:
    return json.dumps(dict(config), sort_keys=True, default=str)


def save_references(path: str | os.PathLike[str], config: Mapping[str, Any], sets: Mapping[str, Reference],
                    probe: str = "") -> bool:
    """Write the sets atomically (a crash leaves the old file or the new one).
    Sets whose log-probs are dense and larger than DENSE_MAX_BYTES are left
    out (deterministic engines recapture them). ``probe``: how they were
    probed (e.g. the quality-probe concurrency), which a load must match.
    True when something was written."""
    import torch

    path = Path(path)
    keep = {}
    for n, r in sets.items():
        if not isinstance(r, Reference):  # e.g. an image workload's references: recaptured (deterministic)
            continue
        enc = encode_logprobs(r.logprobs)
        if "dense" in enc and enc["dense"].numel() * 4 > DENSE_MAX_BYTES:
            continue
        keep[n] = {"prompts": r.prompts, "continuations": r.continuations, "logprobs": enc,
                   "path_noise_nats": r.path_noise_nats}
    if not keep:
        return False
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"config": _key(config), "probe": probe, "sets": keep}, tmp)
    os.replace(tmp, path)
    return True


def load_references(path: str | os.PathLike[str], config: Mapping[str, Any], probe: str = "") -> dict[str, Reference]:
    """The stored sets when they were captured from ``config`` the same way (``probe``); {} when absent,
    damaged, from another stock, or probed otherwise (e.g. all prompts in one request, before
    ``quality.concurrency``: other batches, other rounding)."""
    import torch

    path = Path(path)
    if not path.is_file():
        return {}
    try:  # weights_only: plain containers and tensors, never code
        data = torch.load(path, weights_only=True)
        if not isinstance(data, dict) or data.get("config") != _key(config) or data.get("probe", "") != probe:
            return {}
        return {n: Reference(n, s["prompts"], s["continuations"], decode_logprobs(s["logprobs"]), s["path_noise_nats"])
                for n, s in data["sets"].items()}
    except Exception:  # noqa: BLE001 - a damaged file: the references are captured again, as on a first run
        return {}
