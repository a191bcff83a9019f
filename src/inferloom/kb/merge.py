"""Importing an exported KB document (``inferloom kb import FILE``).

The document (:meth:`RecipeStore.export_document`, written by ``inferloom kb export FILE``)::

    {"format": "inferloom-kb", "schema_version": 1, "exported_at": <unix time>,
     "recipes": [{"key": {7 fields}, "status", "winner", "sessions", "worked",
                  "failed", "lessons", "drift_note", "drift_at", "created_at",
                  "updated_at"}, ...],
     "ceilings": [{"device", "dtype", "mem_bw_bytes_per_s", "matmul_flops_per_s",
                   "measured_at", "details"}, ...]}

Merge rules, per recipe, one transaction each: sessions, worked, failures and
lessons are unions (no duplicates); the imported winner is re-checked against
the strict rules (its recorded evidence: protocol verdict ``keep``, held-out
quality passed, finite ratio and interval) and enters only when it ranks above
the local one (:func:`inferloom.kb.recipe.better`: a promoted winner ranks above
an unpromoted one); the same winner on both sides stays, ``drift`` if either side
marked it. A winner's ``promotion`` (and ``promotion`` history entries) is
dropped on import: an approval is made only here, by ``inferloom promote``, so a
forged one is never listed and never blocks a better winner. The file and its
fields are capped (:mod:`inferloom.kb.limits`), checked before anything is
written. A ceiling is replaced by a
newer measurement only. Importing the same document twice changes nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from inferloom.inputs import InputError, load_json
from inferloom.kb import recipe as R
from inferloom.kb.db import SCHEMA_VERSION, KBError
from inferloom.kb.key import WorkloadKey
from inferloom.kb.limits import MAX_IMPORT_BYTES, ImportRefused, check_document
from inferloom.kb.rows import Ceiling, recipe_columns

__all__ = ["EXPORT_FORMAT", "ImportResult", "import_document", "parse_document", "merge_recipe"]

EXPORT_FORMAT = "inferloom-kb"


@dataclass(frozen=True)
class ImportResult:
    recipes_seen: int
    recipes_changed: int
    winners_entered: int
    winners_rejected: int   # imported winners that fail the strict rules (their lessons still merge)
    ceilings_changed: int


def _lists(d: Mapping[str, Any], name: str, where: str) -> list[dict[str, Any]]:
    v = d.get(name) or []
    if not isinstance(v, list) or not all(isinstance(x, Mapping) for x in v):
        raise ValueError(f"{where}: '{name}' must be a list of objects")
    return [dict(x) for x in v]


def _recipe(d: Any, where: str) -> R.Recipe:
    if not isinstance(d, Mapping):
        raise ValueError(f"{where}: expected an object")
    key = WorkloadKey.from_dict(d.get("key") or {})
    status = d.get("status", "ok")
    if status not in ("ok", "drift"):
        raise ValueError(f"{where}: status {status!r}, expected 'ok' or 'drift'")
    winner = d.get("winner")
    if winner is not None and not isinstance(winner, Mapping):
        raise ValueError(f"{where}: 'winner' must be an object or null")
    winner = {k: v for k, v in winner.items() if k != "promotion"} if winner else None  # approvals are made here
    return R.Recipe(key=key, status=status, winner=winner or None,
                    sessions=[s for s in _lists(d, "sessions", where) if s.get("kind") != "promotion"], worked=_lists(d, "worked", where),
                    failed=_lists(d, "failed", where), lessons=_lists(d, "lessons", where),
                    drift_note=d.get("drift_note"), drift_at=d.get("drift_at"),
                    created_at=float(d.get("created_at") or 0.0), updated_at=float(d.get("updated_at") or 0.0))


def parse_document(path: str | Path) -> tuple[list[R.Recipe], list[Any]]:
    """Read and validate an export; :class:`KBError` (one line, names the file) if unusable."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            data = fh.read(MAX_IMPORT_BYTES + 1)
        if len(data) > MAX_IMPORT_BYTES:
            raise ImportRefused(f"KB export {p}: the file is over the cap of {MAX_IMPORT_BYTES} bytes; "
                                f"nothing was imported")
        doc = load_json(data)
    except FileNotFoundError:
        raise KBError(f"KB export {p}: not found; expected a file written by `inferloom kb export`") from None
    except OSError as exc:
        raise KBError(f"KB export {p}: cannot be read ({exc.__class__.__name__}); check its permissions") from None
    except InputError as exc:
        raise KBError(f"KB export {p}: {exc}; export it again") from None
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
        raise KBError(f"KB export {p}: not an inferloom KB export (format != '{EXPORT_FORMAT}')")
    version = doc.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version > SCHEMA_VERSION:
        raise KBError(f"KB export {p}: schema_version {version!r} is not one this inferloom reads (up to "
                      f"{SCHEMA_VERSION}); upgrade inferloom")
    check_document(doc, str(p))
    try:
        recipes = [_recipe(d, f"recipes[{i}]") for i, d in enumerate(doc.get("recipes") or [])]
        ceils = [Ceiling(str(c["device"]), str(c.get("dtype", "bfloat16")), float(c["mem_bw_bytes_per_s"]),
                         float(c["matmul_flops_per_s"]), float(c["measured_at"]), dict(c.get("details") or {}))
                 for c in doc.get("ceilings") or []]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise KBError(f"KB export {p}: invalid entry ({exc}); export it again") from None
    return recipes, ceils


def merge_recipe(local: R.Recipe | None, inc: R.Recipe) -> tuple[R.Recipe, bool, bool]:
    """``(merged, winner_entered, winner_rejected)`` of ``inc`` into ``local``."""
    rec = local or R.Recipe(key=inc.key, created_at=inc.created_at or time.time())
    inc_w = inc.winner if R.valid_winner(inc.winner) else None
    rejected = inc.winner is not None and inc_w is None
    new = R.Recipe(key=rec.key, status=rec.status, winner=rec.winner, id=rec.id, created_at=rec.created_at,
                   sessions=R.union("sessions", rec.sessions, inc.sessions),
                   worked=R.union("worked", rec.worked, inc.worked, R.WORKED_CAP),
                   failed=R.union("failed", rec.failed, inc.failed, R.FAILED_CAP),
                   lessons=R.union("lessons", rec.lessons, inc.lessons, R.LESSONS_CAP),
                   drift_note=rec.drift_note, drift_at=rec.drift_at)
    entered = False
    if inc_w is not None and rec.winner is not None and inc_w["session_id"] == rec.winner["session_id"]:
        if inc.status == "drift" and (rec.status != "drift" or (inc.drift_at or 0) > (rec.drift_at or 0)):
            new.status, new.drift_note, new.drift_at = "drift", inc.drift_note, inc.drift_at
        if R.promoted(inc_w) and not R.promoted(rec.winner):  # a person's approval travels with the winner
            new.winner = {**rec.winner, "promotion": dict(inc_w["promotion"])}  # never from an import (dropped)
    elif R.better(inc_w, inc.status, rec.winner, rec.status):
        new.winner, new.status = dict(inc_w), inc.status
        new.drift_note, new.drift_at = (inc.drift_note, inc.drift_at) if inc.status == "drift" else (None, None)
        entered = True
    return new, entered, rejected


def import_document(store: Any, path: str | Path) -> ImportResult:
    recipes, ceils = parse_document(path)
    changed = entered = rejected = 0
    for inc in recipes:
        def fn(local: R.Recipe | None, inc: R.Recipe = inc) -> tuple[R.Recipe, tuple[bool, bool, bool]]:
            new, e, r = merge_recipe(local, inc)
            return new, (local is None or recipe_columns(new) != recipe_columns(local), e, r)

        (c, e, r), _ = store._modify(inc.key, fn)
        changed += c
        entered += e
        rejected += r
    n_ceil = store._put_ceilings(ceils, only_newer=True) if ceils else 0
    return ImportResult(len(recipes), changed, entered, rejected, n_ceil)
