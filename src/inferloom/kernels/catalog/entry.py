"""One catalog entry, and the correctness check every entry is held to.

Calling convention (the same as :mod:`inferloom.kernels.base`'s candidates):

* ``inputs, out = entry.make_inputs(shape, dtype, device, seed)``: fresh
  random inputs at ``shape`` (a mapping of ints) and preallocated outputs
  (a tensor, or a tuple of tensors).
* ``entry.implementation(**inputs, out=out)`` writes its result into ``out``
  (optionally ``config=`` a tuning dict; by default the one cached for this
  device, see :mod:`.tuning`).
* ``entry.reference(**inputs)`` returns the truth, computed in float64 (a
  tensor or tuple matching ``out``).
* ``entry.baseline(**inputs)`` runs the op the entry replaces the way the
  model runs it now, at the workload's dtype (what the microbenchmark races).

:func:`check` poisons ``out`` with NaN before the run, so an element the
implementation does not write fails; NaN in an output never passes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from inferloom.kernels.gates import error_metrics

__all__ = ["CatalogEntry", "CheckResult", "check", "poison", "as_tuple", "rng", "randn", "DTYPES"]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def rng(device: str, seed: int) -> torch.Generator:
    """A generator on ``device`` (inputs are drawn where they are used: no host copies)."""
    return torch.Generator(device=torch.device(device)).manual_seed(int(seed))


def randn(g: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    t = torch.randn(shape, generator=g, device=g.device, dtype=torch.float32)
    return (t.mul_(scale) if scale != 1.0 else t).to(dtype)


def as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def poison(out: Any) -> None:
    """Fill every floating output with NaN (integer / fp8 outputs with their max)."""
    for t in as_tuple(out):
        if t.dtype.is_floating_point and t.element_size() >= 2:
            t.fill_(float("nan"))
        else:
            t.fill_(torch.finfo(t.dtype).max if t.dtype.is_floating_point else torch.iinfo(t.dtype).max)


@dataclass(frozen=True, eq=False)
class CatalogEntry:
    """A kernel, its reference, the op it replaces, and what it is held to.

    ``tolerances`` maps a dtype name to ``{"rel_l2": ..., "max_rel": ...}``:
    ``rel_l2`` bounds ``||out - ref||_2 / ||ref||_2`` and ``max_rel`` bounds
    ``max|out - ref| / max|ref|``, each output separately.
    """

    name: str
    target: str  # profile category it rewrites (e.g. "attention", "norm", "matmul")
    target_op: str  # the op pattern it replaces, in words
    implementation: Callable[..., Any]
    reference: Callable[..., Any]
    baseline: Callable[..., Any]
    make_inputs: Callable[[Mapping[str, int], str, str, int], tuple[dict[str, Any], Any]]
    tolerances: Mapping[str, Mapping[str, float]]
    supported_devices: tuple[str, ...] = ("cuda", "cpu")  # cpu means the Triton interpreter
    supported_dtypes: tuple[str, ...] = ("float32", "float16", "bfloat16")
    tune_space: tuple[Mapping[str, Any], ...] = ()
    default_config: Mapping[str, Any] = field(default_factory=dict)
    tune_keys: tuple[str, ...] = ()  # the shape keys a tuned config is cached under
    needs_cuda_capability: tuple[int, int] | None = None
    notes: str = ""
    # makes a shape with its dimensions moved independently valid for make_inputs (the guards' unseen shapes)
    shape_fit: Callable[[dict[str, int]], dict[str, int]] | None = None

    def unsupported(self, dtype: str, device: str) -> str | None:
        """None when the entry runs on this dtype and device, else why not."""
        dev = torch.device(device).type
        if dev not in self.supported_devices:
            return f"{self.name}: device {dev} not supported (supports {', '.join(self.supported_devices)})"
        if dtype not in self.supported_dtypes:
            return f"{self.name}: dtype {dtype} not supported (supports {', '.join(self.supported_dtypes)})"
        if dev == "cpu" and dtype == "bfloat16":
            return f"{self.name}: bfloat16 is wrong under the Triton CPU interpreter; test it on CUDA"
        if dev == "cuda" and self.needs_cuda_capability is not None:
            if not torch.cuda.is_available():
                return "CUDA not available"
            cap = torch.cuda.get_device_capability(torch.device(device))
            if cap < self.needs_cuda_capability:
                return f"{self.name}: needs compute capability {self.needs_cuda_capability}, device has {cap}"
        return None

    def tune_key(self, shape: Mapping[str, int]) -> dict[str, int]:
        return {k: int(shape[k]) for k in self.tune_keys}

    def tolerance(self, dtype: str) -> Mapping[str, float]:
        return self.tolerances[dtype]

    def candidate_fields(self, dtype: str, shapes: tuple[Mapping[str, int], ...]) -> dict[str, Any]:
        """The fields of an ``inferloom.kernels.base.KernelCandidate`` this entry fills
        (the backend adds ``claimed_speedup`` and ``config_changes``). ``out`` may be
        a tuple of tensors (``add_rmsnorm`` writes two): poison each."""
        return {"id": f"catalog:{self.name}", "target": self.target, "op": self.target_op,
                "implementation": self.implementation, "baseline": self.baseline, "reference": self.reference,
                "make_inputs": self.make_inputs, "shapes": tuple(dict(s) for s in shapes), "dtype": dtype,
                "tolerance": dict(self.tolerance(dtype)), "notes": self.notes, "shape_fit": self.shape_fit}


@dataclass
class CheckResult:
    passed: bool
    rule: str  # "ok", "nan_output", "rel_l2", "max_rel", "shape"
    rel_l2: float
    max_rel: float
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _errors(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(rel_l2, max_rel): the KERNEL phase's own error metrics (:func:`inferloom.kernels.gates.error_metrics`)."""
    m = error_metrics(got, ref)
    return m["rel_l2"], m["max_rel"]


def check(entry: CatalogEntry, shape: Mapping[str, int], dtype: str, device: str, seed: int = 0,
          config: Mapping[str, Any] | None = None,
          implementation: Callable[..., Any] | None = None) -> CheckResult:
    """Fresh inputs from ``seed``, poisoned outputs, one run, compare to the float64 reference.

    ``implementation`` overrides the entry's (tests use it for broken variants).
    """
    impl = implementation or entry.implementation
    tol = entry.tolerance(dtype)
    inputs, out = entry.make_inputs(shape, dtype, device, seed)
    poison(out)
    kwargs = {"config": config} if config is not None else {}
    impl(**inputs, out=out, **kwargs)
    ref = as_tuple(entry.reference(**inputs))
    got = as_tuple(out)
    worst_l2 = worst_max = 0.0
    for i, (g, r) in enumerate(zip(got, ref)):
        if tuple(g.shape) != tuple(r.shape):
            return CheckResult(False, "shape", math.inf, math.inf, f"output {i}: {tuple(g.shape)} vs {tuple(r.shape)}")
        n_nan = int(torch.isnan(g.float()).sum())
        if n_nan or not bool(torch.isfinite(g.float()).all()):
            return CheckResult(False, "nan_output", math.inf, math.inf,
                               f"output {i}: {n_nan} NaN / {g.numel()} (unwritten or non-finite elements)")
        l2, mx = _errors(g, r)
        worst_l2, worst_max = max(worst_l2, l2), max(worst_max, mx)
    if len(got) != len(ref):
        return CheckResult(False, "shape", math.inf, math.inf, f"{len(got)} outputs vs {len(ref)} in the reference")
    if not worst_l2 <= tol["rel_l2"]:
        return CheckResult(False, "rel_l2", worst_l2, worst_max, f"rel_l2 {worst_l2:.3g} > {tol['rel_l2']:.3g}")
    if not worst_max <= tol["max_rel"]:
        return CheckResult(False, "max_rel", worst_l2, worst_max, f"max_rel {worst_max:.3g} > {tol['max_rel']:.3g}")
    return CheckResult(True, "ok", worst_l2, worst_max)
