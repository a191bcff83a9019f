"""The KERNEL phase's extension point: a kernel backend and its candidates.

Contract:

* A :class:`KernelBackend` looks at the profile's hot categories (selected
  by :func:`inferloom.kernels.select.select_targets`) and the workload, and
  proposes :class:`KernelCandidate` s. One backend runs per KERNEL phase
  (``spec.kernels.backend``). A backend's claims are never trusted: every
  candidate passes the gates of :mod:`inferloom.kernels.gates` (correctness
  at the workload's real shapes, then a microbenchmark against the op it
  replaces), and only the coordinator's paired end-to-end measurement with
  the quality contract keeps anything.
* A candidate names its ``target`` (a profile category), the ``op`` it
  replaces, the ``shapes`` it is checked at, its ``tolerance`` and its
  ``claimed_speedup`` (of the op, recorded as ``unverified``), and the knob
  ``config_changes`` that switch it on end to end (so the measurement, the
  ledger, the knowledge base and resume treat it like any configuration).
* Calling convention: ``inputs, out = make_inputs(shape, dtype, device,
  seed)``; ``implementation(**inputs, out=out)`` writes its result into
  ``out`` (the gate fills ``out`` with NaN first, so an element it does not
  write fails); ``baseline(**inputs)`` is the op it replaces at the
  workload's dtype (what the microbenchmark races; its result, or a tuple
  whose first is the result where the op writes more, as vLLM's RMSNorm
  hands on its residual); ``timed(**inputs)``, where a candidate has one,
  is the kernel as it is delivered (its result returned: the microbenchmark
  times it instead of ``implementation``, so the gates' copy into ``out`` is
  not counted on one side only); ``reference(**inputs)`` is the truth in
  higher precision (what correctness compares against).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, runtime_checkable, Sequence

from inferloom.frameworks import described
from inferloom.models.diffusion_shapes import diffusion_workload
from inferloom.models.presets import PRESETS

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["KernelCandidate", "KernelBackend", "Target", "model_config", "workload_of", "no_image_op"]


@dataclass(frozen=True)
class Target:
    """A profile category the KERNEL phase considered, and why it was picked or passed over."""

    category: str
    share: float
    picked: bool
    why: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True, eq=False)
class KernelCandidate:
    """One proposed kernel replacement (see the module docstring)."""

    id: str
    target: str
    op: str
    implementation: Callable[..., Any]
    baseline: Callable[..., Any]
    reference: Callable[..., Any]
    make_inputs: Callable[[Mapping[str, int], str, str, int], tuple[dict[str, Any], Any]]
    shapes: tuple[Mapping[str, int], ...]
    dtype: str
    claimed_speedup: float
    config_changes: Mapping[str, Any]
    tolerance: Mapping[str, float] = field(default_factory=lambda: {"rel_l2": 1e-2, "max_rel": 5e-2})
    notes: str = ""
    # profile categories that the replaced op also spends time in (e.g. the KV
    # copies that transformers' decode attention makes before SDPA): the
    # microbenchmark's baseline includes that work, so Amdahl's bound counts
    # their shares with the target's
    covers: tuple[str, ...] = ()
    # makes a shape the reward-hacking guards moved (each dimension to a nearby odd size) valid for
    # make_inputs again, e.g. decode attention's q_heads a multiple of kv_heads (None: every shape is valid)
    shape_fit: Callable[[dict[str, int]], dict[str, int]] | None = None
    # what the microbenchmark times instead of ``implementation(**inputs, out=out)``: the kernel as it is
    # delivered when that returns its result rather than writing an ``out`` (a server's ``forward``), so the
    # gates' copy into ``out`` is not counted against it while ``baseline`` returns its own (None: implementation)
    timed: Callable[..., Any] | None = None

    def to_record(self) -> dict[str, Any]:
        """JSON-able description (no callables) for the ledger."""
        return {"id": self.id, "target": self.target, "op": self.op, "shapes": [dict(s) for s in self.shapes],
                "dtype": self.dtype, "tolerance": dict(self.tolerance), "claimed_speedup": self.claimed_speedup,
                "claim_status": "unverified", "config_changes": dict(self.config_changes), "covers": list(self.covers),
                "notes": self.notes}


@runtime_checkable
class KernelBackend(Protocol):
    """Proposes kernel replacements for hot ops (see the module docstring).

    The contract, checked for every backend registered in
    ``tests/test_kernel_backend_conformance.py``:

    * ``name``: a non-empty string, the same for every instance (the ledger
      records the backend's candidates as ``kernel:<name>``).
    * ``unavailable(workload)``: None when the backend can work on
      ``workload`` (the dict of :func:`workload_of`), else a non-empty reason
      (the KERNEL phase is skipped with it). It never raises, whatever the
      framework or device, and changes nothing.
    * ``rewritable()``: a frozenset of profile category names, the same on
      every call, none of :data:`inferloom.kernels.select.NOT_KERNELS` (host
      idle, communication, other: never a kernel target).
    * ``propose(targets, workload)``, called only when ``unavailable`` gave
      None, returns a list of :class:`KernelCandidate`:

      - only for targets that are ``picked`` and in ``rewritable()``: every
        candidate's ``target`` is one of them, so no picked target gives
        ``[]``; so does nothing left to replace;
      - deterministic: the same targets and workload give the same candidates
        in the same order with the same ids (the phase calls ``propose``
        again on every tick and resumes by position; it decides a candidate
        once per session by its ``id``); ids are unique in the list;
      - ``config_changes``: a non-empty mapping of knobs of the engine's knob
        space whose ``phase`` is ``KERNEL``, each value in the knob's domain,
        switching on something ``workload["stack"]`` does not already have
        (once a candidate's changes are in the stack it is not proposed
        again);
      - well-formed: a non-empty ``op``; ``shapes`` a non-empty tuple of
        ``{name: int}``; ``dtype`` the workload's; a finite
        ``claimed_speedup`` > 0; ``tolerance`` with finite ``rel_l2`` and
        ``max_rel`` > 0; ``covers`` categories other than the target;
        ``to_record()`` JSON-able; the calling convention of the module
        docstring, where ``baseline`` and ``reference`` give the shape of
        ``out`` and run on the CPU too (the implementation may need the
        device);
      - it changes neither ``targets`` nor ``workload``.
    """

    name: str

    def unavailable(self, workload: Mapping[str, Any]) -> str | None:
        """None when the backend can work on this workload, else the reason it can't."""
        ...

    def rewritable(self) -> frozenset[str]:
        """Profile categories this backend has kernels for."""
        ...

    def propose(self, targets: Sequence[Target], workload: Mapping[str, Any]) -> list[KernelCandidate]:
        """Candidates for the picked targets, hottest first."""
        ...


def model_config(model: str) -> dict[str, Any]:
    """The HF config fields of a preset, or of a local model directory's config.json."""
    if model in PRESETS:
        return dict(PRESETS[model])
    return json.loads((Path(model) / "config.json").read_text())


def workload_of(spec: WorkloadSpec, device: str, stack: Mapping[str, Any]) -> dict[str, Any]:
    """What a backend sees of the workload: device, dtype, model, traffic, the current stack, the server's
    ``serving.extra_args`` as ``server_args`` where the spec sets some; for an image workload also
    ``diffusion`` (:func:`~inferloom.models.diffusion_shapes.diffusion_workload`)."""
    t = spec.traffic
    out = {"device": device, "dtype": str(stack.get("dtype", spec.dtype)), "model": spec.model,
           "framework": spec.framework, "batch": t.concurrency, "input_len": t.input_len,
           "output_len": t.output_len, "stack": dict(stack)}
    serving = getattr(spec, "serving", None)
    if serving is not None and serving.extra_args:  # a server's own arguments (e.g. --enforce-eager)
        out["server_args"] = list(serving.extra_args)
    if getattr(spec, "diffusion", None) is not None:  # an image workload: the denoiser's shapes
        out["diffusion"] = diffusion_workload(spec)
    return out


def no_image_op(workload: Mapping[str, Any]) -> str | None:
    """Why a backend has nothing for an image workload (no eager RMSNorm in the denoiser, the one image op the
    backends replace), else None; None for any other workload. So the KERNEL phase is skipped with this reason
    and FRAMEWORK keeps no budget for it."""
    fw = described(workload.get("framework"))
    if fw is None or not fw.image or (workload.get("diffusion") or {}).get("rmsnorms"):
        return None
    return ("the denoiser has no eager RMSNorm (SD3.5's q/k norms), the only image-pipeline op the kernel "
            "backends replace")
