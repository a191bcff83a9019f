"""Which profiled categories the KERNEL phase works on, and why.

A category is picked when the backend can rewrite it and it takes at least
``min_share`` of the profiled run's wall time; hottest first. Host idle /
launch gaps are never a kernel target (CUDA graphs and compilation, in the
FRAMEWORK phase, are what removes them). Every category gets a reason,
picked or not, for the ledger.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from inferloom.kernels.base import Target
from inferloom.spec import KernelSpec, field_default

__all__ = ["select_targets", "MIN_SHARE", "NOT_KERNELS"]

MIN_SHARE: float = field_default(KernelSpec, "min_share")  # the spec declares it: kernels.min_share
NOT_KERNELS = frozenset({"idle", "communication", "other"})


def select_targets(categories: Mapping[str, Mapping[str, Any]] | None, rewritable: Iterable[str],
                   min_share: float = MIN_SHARE) -> list[Target]:
    """Targets in descending share; ``categories`` is a profile's ``categories`` map."""
    can = frozenset(rewritable)
    rows = sorted(((str(k), float((v or {}).get("share") or 0.0)) for k, v in (categories or {}).items()),
                  key=lambda kv: -kv[1])
    out = []
    for cat, share in rows:
        if cat in NOT_KERNELS:
            why = ("host idle / launch gaps: not a kernel; CUDA graphs or compilation remove them"
                   if cat == "idle" else f"{cat}: no kernel to write for it")
            out.append(Target(cat, share, False, why))
        elif cat not in can:
            out.append(Target(cat, share, False, f"the backend has no kernel for {cat}"))
        elif share < min_share:
            out.append(Target(cat, share, False, f"{share * 100:.1f}% of the run, below the {min_share * 100:.0f}% worth a kernel"))
        else:
            out.append(Target(cat, share, True, f"{share * 100:.1f}% of the run and the backend can rewrite it"))
    return out
