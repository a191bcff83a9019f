"""What the server engines' MoE knobs share: whether the model has MoE layers at all.

A knob of the experts' kernels (vLLM's ``moe_backend``, SGLang's ``moe_runner_backend``) means nothing for a
dense model: its adapter drops it with :func:`moe_only_refusal`'s reason, read from the model directory's
``config.json`` (:func:`config_json`), as ``vllm_moe_configs.moe_shape`` reads an MoE shape.

A spec's device ``cuda`` names NVIDIA and AMD GPUs alike (ROCm torch is ``cuda``), and both engines' experts'
backends include one vendor's kernels only (FlashInfer's CUTLASS / TRT-LLM: NVIDIA; AITER: AMD):
:func:`vendor_narrowed` asks the server's own torch which build it is (:func:`gpu_vendor`, one torch import, only
for an MoE model on a GPU) and drops the other vendor's values before the search sees them; when it can't tell, all
stay and one the GPU lacks fails at its server's start (recorded)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any, Iterable, Mapping

from inferloom.workloads.base import Knob
from inferloom.workloads.vllm_moe_configs import moe_shape

__all__ = ["config_json", "moe_only_refusal", "drop_moe_only", "VENDOR_ONLY", "gpu_vendor", "narrow_to_vendor",
           "vendor_narrowed"]

#: the experts' backends only one vendor's GPUs run: FlashInfer's kernels are NVIDIA's (CUDA), AITER is AMD's (ROCm)
VENDOR_ONLY = {"flashinfer_cutlass": "nvidia", "flashinfer_trtllm": "nvidia", "aiter": "amd"}
_VENDOR_PROBE = ("import torch; print('amd' if getattr(torch.version, 'hip', None) "
                 "else 'nvidia' if torch.version.cuda else '')")


def config_json(model_dir: str | Path) -> dict[str, Any] | None:
    """The model directory's ``config.json``, or None when it can't be read."""
    try:
        out = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return out if isinstance(out, dict) else None


def moe_only_refusal(knob: str, hf_config: Mapping[str, Any] | None) -> str | None:
    """Why a knob of MoE layers does not apply to this model (its config unreadable, or a dense model), or None."""
    if hf_config is None:
        return f"{knob}: the model's config.json can't be read, so whether it has MoE layers is unknown"
    if moe_shape(hf_config) is None:
        return f"{knob}: the model has no MoE layers (a dense model)"
    return None


def drop_moe_only(kept: Iterable[Knob], dropped: Mapping[str, str], whys: Mapping[str, str | None],
                  ) -> tuple[list[Knob], dict[str, str]]:
    """``(kept, dropped)`` with each knob of ``whys`` that has a reason moved from kept to dropped."""
    gone = {k.name: whys[k.name] for k in kept if whys.get(k.name) is not None}
    return [k for k in kept if k.name not in gone], {**dropped, **{k: str(v) for k, v in gone.items()}}


def gpu_vendor(python: str, env: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """``(vendor, why)``: whose GPUs the server's torch is built for (``amd``: ``torch.version.hip``; ``nvidia``:
    ``torch.version.cuda``), asked of the server's own Python (one torch import: a spec's device ``cuda`` is
    both vendors' name), or ``(None, why not)``."""
    try:
        r = subprocess.run([python, "-c", _VENDOR_PROBE], capture_output=True, text=True, timeout=120,
                           env=dict(env) if env is not None else None)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"the server's python could not be asked ({type(exc).__name__})"
    said = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    if r.returncode != 0 or said not in ("amd", "nvidia"):
        return None, f"the server's torch names no GPU build ({(r.stderr.strip() or said)[-160:]})"
    return said, f"the server's torch is a {'ROCm' if said == 'amd' else 'CUDA'} build"


def narrow_to_vendor(knob: Knob, vendor: str, how: str) -> tuple[Knob, str]:
    """``knob`` (an experts' backend knob) without the values another vendor's GPUs run, and the note saying so
    ("" when nothing was dropped)."""
    lost = [str(c) for c in knob.choices or () if VENDOR_ONLY.get(str(c), vendor) != vendor]
    if not lost:
        return knob, ""
    keep = tuple(c for c in knob.choices or () if str(c) not in lost)
    return (dataclasses.replace(knob, choices=keep),
            f"{', '.join(lost)}: {'AMD' if vendor == 'nvidia' else 'NVIDIA'} GPUs' kernels, and {how}; never proposed")


def vendor_narrowed(kept: list[Knob], notes: Mapping[str, str], knob: str, python: str,
                    env: Mapping[str, str]) -> tuple[list[Knob], dict[str, str]]:
    """``(kept, notes)`` with ``knob`` (when kept) narrowed to the server's GPU vendor, the note saying what went
    or that the vendor is unknown."""
    out_notes = dict(notes)
    if knob not in {k.name for k in kept}:
        return kept, out_notes
    vendor, how = gpu_vendor(python, env)
    if vendor is None:
        out_notes[knob] = (f"which GPU vendor runs the server is unknown ({how}): every value stays, one the GPU "
                           "lacks fails at its server's start")
        return kept, out_notes
    out = []
    for k in kept:
        if k.name == knob:
            k, note = narrow_to_vendor(k, vendor, how)
            if note:
                out_notes[knob] = "; ".join(n for n in (notes.get(knob), note) if n)
        out.append(k)
    return out, out_notes
