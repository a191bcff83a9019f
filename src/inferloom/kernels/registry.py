"""Which kernel backend a KERNEL phase runs (``spec.kernels.backend``).

``auto``: ``catalog`` on CUDA (where triton is missing it says so and the
phase is skipped), ``torch`` otherwise, and none for the synthetic adapter (it
runs no operators). ``none``: the phase is
skipped. A backend that cannot work on the workload gives its reason, and the
phase is skipped with it.
"""

from __future__ import annotations

from typing import Any, Mapping

from inferloom.frameworks import described
from inferloom.kernels.base import KernelBackend
from inferloom.kernels.catalog_backend import CatalogBackend
from inferloom.kernels.torch_backend import TorchBackend

__all__ = ["resolve_backend"]


def resolve_backend(name: str, workload: Mapping[str, Any]) -> tuple[KernelBackend | None, str]:
    """``(backend, why)``; backend None means the phase is skipped for ``why``."""
    if name == "none":
        return None, "spec.kernels.backend is none"
    fw = described(workload.get("framework"))
    if fw is not None and not fw.runs_operators and name == "auto":
        return None, f"no kernel backend applies: the {fw.name} adapter runs no operators"
    chosen: KernelBackend
    if name == "catalog" or (name == "auto" and workload.get("device") == "cuda"):
        chosen = CatalogBackend()
    else:
        chosen = TorchBackend()
    reason = chosen.unavailable(workload)
    if reason:
        return None, f"backend {chosen.name}: {reason}"
    return chosen, f"backend {chosen.name}"
