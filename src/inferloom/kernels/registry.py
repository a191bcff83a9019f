"""Which kernel backend a KERNEL phase runs (``spec.kernels.backend``).

``auto``: ``catalog`` on CUDA when it is importable, ``torch`` otherwise, and
none for the synthetic adapter (it runs no operators). ``none``: the phase is
skipped. A backend that cannot work on the workload gives its reason, and the
phase is skipped with it.
"""

from __future__ import annotations

from typing import Any, Mapping

from inferloom.kernels.base import KernelBackend

__all__ = ["resolve_backend"]


def _catalog() -> tuple[KernelBackend | None, str | None]:
    try:
        from inferloom.kernels.catalog_backend import CatalogBackend  # type: ignore[import-not-found]
    except ImportError as exc:
        return None, f"the catalog backend is not available here ({exc})"
    return CatalogBackend(), None


def resolve_backend(name: str, workload: Mapping[str, Any]) -> tuple[KernelBackend | None, str]:
    """``(backend, why)``; backend None means the phase is skipped for ``why``."""
    if name == "none":
        return None, "spec.kernels.backend is none"
    if workload.get("framework") == "synthetic" and name == "auto":
        return None, "no kernel backend applies: the synthetic adapter runs no operators"
    chosen: KernelBackend | None
    if name == "catalog" or (name == "auto" and workload.get("device") == "cuda"):
        chosen, why = _catalog()
        if chosen is None:
            if name == "catalog":
                return None, why or "catalog backend unavailable"
            from inferloom.kernels.torch_backend import TorchBackend

            chosen = TorchBackend()
    else:
        from inferloom.kernels.torch_backend import TorchBackend

        chosen = TorchBackend()
    reason = chosen.unavailable(workload)
    if reason:
        return None, f"backend {chosen.name}: {reason}"
    return chosen, f"backend {chosen.name}"
