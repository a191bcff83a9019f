"""The KB's rows as Python values, both ways: a ``recipes`` row <-> :class:`~inferloom.kb.recipe.Recipe`,
a ``ceilings`` row -> :class:`Ceiling`.

Shared by the store (writes, exact reads), the relaxed lookup and the import
merge, which all read or compare rows; it imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferloom.kb import recipe as R
from inferloom.kb.db import dumps, loads
from inferloom.kb.key import KEY_FIELDS, WorkloadKey

__all__ = ["Ceiling", "row_to_recipe", "recipe_columns", "row_to_ceiling"]


@dataclass(frozen=True)
class Ceiling:
    """Measured ceilings of one device: bytes/s of memory bandwidth, FLOP/s of matmul in ``dtype``."""

    device: str
    dtype: str
    mem_bw_bytes_per_s: float
    matmul_flops_per_s: float
    measured_at: float
    details: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def row_to_recipe(row: Any) -> R.Recipe:
    m = row._mapping
    winner = None
    if m["winner_config"] is not None:
        winner = {"config": loads(m["winner_config"]), "changes": loads(m["winner_changes"], {}),
                  "ratio": m["ratio"], "ci_low": m["ci_low"], "ci_high": m["ci_high"],
                  "stock_objective": m["stock_objective"], "final_objective": m["final_objective"],
                  "n_pairs": m["n_pairs"], "session_id": m["winner_session_id"], "recorded_at": m["winner_at"],
                  "evidence": loads(m["winner_evidence"], {})}
        if m["promotion"] is not None:
            winner["promotion"] = loads(m["promotion"])
    return R.Recipe(key=WorkloadKey(**{f: m[f] for f in KEY_FIELDS}), status=m["status"], winner=winner,
                    sessions=loads(m["sessions"], []), worked=loads(m["worked"], []), failed=loads(m["failed"], []),
                    lessons=loads(m["lessons"], []), drift_note=m["drift_note"], drift_at=m["drift_at"],
                    created_at=m["created_at"], updated_at=m["updated_at"], id=m["id"])


def recipe_columns(r: R.Recipe) -> dict[str, Any]:
    w = r.winner
    cols: dict[str, Any] = {"status": r.status, "sessions": dumps(r.sessions), "worked": dumps(r.worked),
                            "failed": dumps(r.failed), "lessons": dumps(r.lessons), "drift_note": r.drift_note,
                            "drift_at": r.drift_at}
    cols.update({"winner_config": dumps(w["config"]) if w else None,
                 "winner_changes": dumps(w["changes"]) if w else None,
                 "ratio": w["ratio"] if w else None, "ci_low": w["ci_low"] if w else None,
                 "ci_high": w["ci_high"] if w else None, "stock_objective": w.get("stock_objective") if w else None,
                 "final_objective": w.get("final_objective") if w else None, "n_pairs": w.get("n_pairs") if w else None,
                 "winner_session_id": w["session_id"] if w else None,
                 "winner_evidence": dumps(w.get("evidence") or {}) if w else None,
                 "winner_at": w.get("recorded_at") if w else None})
    promo = w.get("promotion") if w else None
    cols.update({"promoted_at": promo.get("at") if isinstance(promo, dict) else None,
                 "promotion": dumps(promo) if isinstance(promo, dict) else None})
    return cols


def row_to_ceiling(r: Any) -> Ceiling:
    m = r._mapping
    return Ceiling(m["device"], m["dtype"], m["mem_bw_bytes_per_s"], m["matmul_flops_per_s"], m["measured_at"],
                   loads(m["details"], {}))
