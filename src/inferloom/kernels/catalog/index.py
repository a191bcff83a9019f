"""The catalog's entries by name, in priority order.

Imports every kernel module of the catalog, so importing it needs triton
(check :func:`inferloom.kernels.catalog.triton_available` first where it may
be missing).
"""

from __future__ import annotations

from inferloom.kernels.catalog import decode_attention, fp8, mlp, rmsnorm
from inferloom.kernels.catalog.entry import CatalogEntry

__all__ = ["entries", "get"]


def entries() -> list[CatalogEntry]:
    """All entries, in priority order."""
    return [decode_attention.ENTRY, rmsnorm.ENTRY, mlp.GATE_UP_ENTRY, mlp.SILU_MUL_ENTRY, mlp.QKV_ENTRY, fp8.ENTRY]


def get(name: str) -> CatalogEntry:
    for e in entries():
        if e.name == name:
            return e
    raise KeyError(f"no catalog entry {name!r}")
