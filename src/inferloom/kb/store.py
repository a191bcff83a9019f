"""``RecipeStore``: the Recipe KB over a SQL URL (SQLite by default).

Writes are strict (see :mod:`inferloom.kb.recipe`): a winning configuration
enters only from a paired, protocol-kept, held-out-quality-passing final
comparison; any other session adds its lessons and failures and nothing else,
and never removes a winner. Every write is one short transaction on one
recipe (``BEGIN IMMEDIATE`` on SQLite), so concurrent sessions writing one KB
serialize instead of corrupting it or losing updates. Recording the same
session twice changes nothing (a resumed CLOSE may record again).

Each public call is retried whole while a KB server can't be reached
(:meth:`~inferloom.kb.db.Database.retrying`): a PostgreSQL restart mid-fleet
delays a write instead of losing it, and a write whose commit landed before
the connection dropped is found already recorded on the retry.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

from sqlalchemy import Connection, select
from sqlalchemy.exc import IntegrityError

from inferloom.kb import recipe as R
from inferloom.kb.db import SCHEMA_VERSION, Database, KBError, ceilings, default_kb_url, dumps, recipes
from inferloom.kb.key import KEY_FIELDS, WorkloadKey
from inferloom.kb.lookup import LookupResult, lookup
from inferloom.kb.merge import EXPORT_FORMAT, ImportResult, import_document
from inferloom.kb.rows import Ceiling, recipe_columns, row_to_ceiling, row_to_recipe

__all__ = ["RecipeStore", "RecordResult"]


@dataclass(frozen=True)
class RecordResult:
    """What :meth:`RecipeStore.record_session` did."""

    recipe_id: int
    winner_entered: bool   # this session's result is now the recipe's winner
    validated: bool        # the session passed the strict rules (a valid winner, entered or not)
    rule: str              # 'keep', or the strict rule it failed (e.g. 'final-quality-failed')
    reason: str            # one line
    already_recorded: bool = False


F = TypeVar("F", bound=Callable[..., Any])


def _retried(doing: str) -> Callable[[F], F]:
    """Run the method again while the KB server can't be reached (one idempotent transaction)."""
    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(self: "RecipeStore", *a: Any, **kw: Any) -> Any:
            return self.db.retrying(lambda: fn(self, *a, **kw), doing)
        return wrapper  # type: ignore[return-value]
    return deco


def _key_where(key: WorkloadKey) -> list[Any]:
    return [recipes.c[f] == getattr(key, f) for f in KEY_FIELDS]


class RecipeStore:
    """The Recipe KB at ``url`` (a SQL URL or a SQLite file path; default
    :func:`default_kb_url`). Opening creates the schema if missing; a bad URL
    or an unusable file raises :class:`KBError` (one line, names the file)."""

    def __init__(self, url: str | None = None) -> None:
        self.db = Database(url or default_kb_url())
        self.url = self.db.url

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "RecipeStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------ internals
    def _locked(self, conn: Connection, key: WorkloadKey) -> R.Recipe | None:
        row = conn.execute(select(recipes).where(*_key_where(key)).with_for_update()).first()
        return row_to_recipe(row) if row is not None else None

    def _modify(self, key: WorkloadKey, fn: Any) -> tuple[Any, int | None]:
        """Run ``fn(recipe_or_None) -> (new_recipe_or_None, result)`` in one write
        transaction; write the new recipe when it differs. Returns ``(result, recipe id)``."""
        for attempt in range(3):
            try:
                with self.db.write() as conn:
                    old = self._locked(conn, key)
                    new, result = fn(old)
                    if new is None or (old is not None and recipe_columns(new) == recipe_columns(old)):
                        return result, (old.id if old else None)
                    now = time.time()
                    new.updated_at = now
                    if old is None:
                        new.created_at = new.created_at or now
                        ins = recipes.insert().values(**key.to_dict(), **recipe_columns(new),
                                                      created_at=new.created_at, updated_at=now)
                        new.id = conn.execute(ins).inserted_primary_key[0]
                    else:
                        new.id = old.id
                        conn.execute(recipes.update().where(recipes.c.id == old.id).values(**recipe_columns(new), updated_at=now))
                    return result, new.id
            except IntegrityError as exc:
                # Two writers created the same new recipe at once (PostgreSQL): retry, it now exists.
                if attempt == 2:
                    raise self.db.error(exc, "writing") from None
        raise AssertionError("unreachable")

    # ------------------------------------------------------------ writes
    @_retried("writing")
    def record_session(self, key: WorkloadKey, breakdown: Mapping[str, Any], session_id: str,
                       lessons: list[Any] | None = None, failures: list[Mapping[str, Any]] | None = None) -> RecordResult:
        """Record a finished session's breakdown under ``key``.

        ``lessons`` (strings or ``{text}``) and ``failures`` (``{changes, rule,
        ...}``): None derives them from the breakdown (every verdict's lesson;
        rejected trials with their outcome as rule, refusals with their rule,
        and a failed final stack); a list is taken as given."""
        if not session_id:
            raise ValueError("session_id: expected a non-empty string")
        now = time.time()
        winner, code, why = R.winner_from_breakdown(breakdown, session_id, now)
        les = (R.normalize_lessons(lessons, session_id, now) if lessons is not None
               else R.lessons_from_breakdown(breakdown, session_id, now, why))
        fails = (R.normalize_failures(failures, session_id, now) if failures is not None
                 else R.failures_from_breakdown(breakdown, session_id, now, code, why))
        worked = R.worked_from_breakdown(breakdown, session_id, now) if winner else []
        f = breakdown.get("final") if isinstance(breakdown.get("final"), Mapping) else {}

        def fn(old: R.Recipe | None) -> tuple[R.Recipe | None, RecordResult]:
            rec = old or R.Recipe(key=key, created_at=now)
            if session_id in rec.session_ids:
                return None, RecordResult(rec.id or 0, False, winner is not None, code,
                                          f"session {session_id} is already recorded", already_recorded=True)
            enters = R.better(winner, "ok", rec.winner, rec.status)
            reason = why
            if winner and not enters:
                why_kept = (f"promoted by {rec.winner['promotion']['by']}" if R.promoted(rec.winner) else "is better")
                reason = (f"validated x{winner['ratio']:.3f}, but the recorded winner (session "
                          f"{rec.winner['session_id']}, x{rec.winner['ratio']:.3f}) {why_kept}: kept it")
            entry = {"kind": "session", "session_id": session_id, "at": now, "rule": code, "reason": reason,
                     "winner_entered": enters, "ratio": f.get("ratio"), "ci_low": f.get("ci_low"),
                     "ci_high": f.get("ci_high"), "protocol_verdict": f.get("protocol_verdict"),
                     "quality_passed": f.get("quality_passed"), "stop_reason": breakdown.get("stop_reason"),
                     "changes": winner["changes"] if winner else None}
            new = R.Recipe(key=key, status=rec.status, winner=rec.winner, created_at=rec.created_at, id=rec.id,
                           sessions=R.union("sessions", rec.sessions, [entry]),
                           worked=R.union("worked", rec.worked, worked, R.WORKED_CAP),
                           failed=R.union("failed", rec.failed, fails, R.FAILED_CAP),
                           lessons=R.union("lessons", rec.lessons, les, R.LESSONS_CAP),
                           drift_note=rec.drift_note, drift_at=rec.drift_at)
            if enters:
                new.winner, new.status, new.drift_note, new.drift_at = winner, "ok", None, None
            return new, RecordResult(rec.id or 0, enters, winner is not None, code, reason)

        res, rid = self._modify(key, fn)
        return replace(res, recipe_id=rid or 0)

    def record_closed_session(self, *, manifest: Mapping[str, Any], state: Any,
                              breakdown: Mapping[str, Any]) -> tuple[WorkloadKey, RecordResult]:
        """Record a closed session from what its caller read of it: ``manifest``
        (the ``manifest.json`` dict: the key), ``state`` (a ``SessionState`` or
        its ``state.json`` dict: the session id, and the workload when the
        manifest has no spec) and ``breakdown`` (the session breakdown, as
        as the ``report`` command derives it from the ledger)."""
        session_id = state.get("session_id") if isinstance(state, Mapping) else getattr(state, "session_id", None)
        key = WorkloadKey.from_session(manifest, state)
        return key, self.record_session(key, breakdown, session_id)

    @_retried("writing")
    def mark_drift(self, key_or_id: WorkloadKey | int | str, note: str, session_id: str | None = None,
                   expected_winner: str | None = None) -> R.Recipe:
        """Mark a recipe's winner ``drift`` (it did not reproduce). Pass the key of
        the recipe that was replayed (``LookupResult.chosen.key``), not the
        session's own key when the lookup was relaxed. The winner stays (as
        evidence) but ranks below any non-drifted one and its lookup
        confidence is halved; the next valid winner replaces it.

        ``expected_winner``: the winner's session id that was replayed; when
        another session replaced that winner meanwhile, nothing is marked
        (the recipe is returned unchanged)."""
        key = self.show(key_or_id).key
        now = time.time()

        def fn(old: R.Recipe | None) -> tuple[R.Recipe | None, R.Recipe]:
            if old is None or old.winner is None:
                raise KBError(f"KB {self.db.where}: recipe {key} has no winning configuration to mark as drift")
            if expected_winner is not None and old.winner["session_id"] != expected_winner:
                return None, old
            new = R.Recipe(**{**old.__dict__, "status": "drift", "drift_note": str(note), "drift_at": now,
                              "sessions": old.sessions + [{"kind": "drift", "session_id": session_id, "at": now,
                                                           "note": str(note)}]})
            return new, new

        return self._modify(key, fn)[0]

    @_retried("writing")
    def promote(self, key: WorkloadKey, winner: Mapping[str, Any], promotion: Mapping[str, Any]) -> R.Recipe:
        """A person's approval (``inferloom promote``): ``winner`` (from the session's breakdown, the strict
        rules already passed: :func:`~inferloom.kb.recipe.winner_from_breakdown`) becomes the recipe's winner
        with ``promotion`` (``by``, ``at``, ``note``, ``bundle_hash``, ``session_id``) attached, over any
        unpromoted one, and the promotion is added to the recipe's history. Called by a person's command
        only: inferloom never promotes on its own."""
        if not R.valid_winner(winner) or not promotion.get("by"):
            raise ValueError("promote: expected a winner that passes the strict rules and a promotion with 'by'")
        promo = dict(promotion)

        def fn(old: R.Recipe | None) -> tuple[R.Recipe | None, R.Recipe]:
            rec = old or R.Recipe(key=key, created_at=promo["at"])
            entry = {"kind": "promotion", **promo, "ratio": winner["ratio"], "ci_low": winner["ci_low"],
                     "ci_high": winner["ci_high"], "changes": winner["changes"],
                     "replaced_winner": (rec.winner or {}).get("session_id")}
            new = R.Recipe(**{**rec.__dict__, "status": "ok", "winner": {**winner, "promotion": promo},
                              "drift_note": None, "drift_at": None,
                              "sessions": R.union("sessions", rec.sessions, [entry])})
            return new, new

        rec, rid = self._modify(key, fn)
        rec.id = rid
        return rec

    @_retried("writing")
    def put_ceiling(self, device: str, *, mem_bw_bytes_per_s: float, matmul_flops_per_s: float,
                    dtype: str = "bfloat16", measured_at: float | None = None,
                    details: Mapping[str, Any] | None = None) -> Ceiling:
        """Store (replace) the measured ceilings of ``device`` for ``dtype``."""
        c = Ceiling(device, dtype, float(mem_bw_bytes_per_s), float(matmul_flops_per_s),
                    float(measured_at if measured_at is not None else time.time()), dict(details or {}))
        self._put_ceilings([c], only_newer=False)
        return c

    def _put_ceilings(self, items: list[Ceiling], only_newer: bool) -> int:
        for attempt in range(3):
            try:
                return self._put_ceilings_once(items, only_newer)
            except IntegrityError as exc:  # a concurrent first insert (PostgreSQL): retry, it now exists
                if attempt == 2:
                    raise self.db.error(exc, "writing") from None
        raise AssertionError("unreachable")

    def _put_ceilings_once(self, items: list[Ceiling], only_newer: bool) -> int:
        changed = 0
        with self.db.write() as conn:
            for c in items:
                where = [ceilings.c.device == c.device, ceilings.c.dtype == c.dtype]
                old = conn.execute(select(ceilings).where(*where).with_for_update()).first()
                vals = {"mem_bw_bytes_per_s": c.mem_bw_bytes_per_s, "matmul_flops_per_s": c.matmul_flops_per_s,
                        "measured_at": c.measured_at, "details": dumps(c.details)}
                if old is None:
                    conn.execute(ceilings.insert().values(device=c.device, dtype=c.dtype, **vals))
                elif (not only_newer or c.measured_at > old.measured_at) and \
                        vals != {k: old._mapping[k] for k in vals}:
                    conn.execute(ceilings.update().where(*where).values(**vals))
                else:
                    continue
                changed += 1
        return changed

    # ------------------------------------------------------------ reads
    @_retried("reading")
    def get_ceiling(self, device: str, dtype: str = "bfloat16") -> Ceiling | None:
        with self.db.read() as conn:
            r = conn.execute(select(ceilings).where(ceilings.c.device == device, ceilings.c.dtype == dtype)).first()
        return None if r is None else row_to_ceiling(r)

    @_retried("reading")
    def list_ceilings(self) -> list[Ceiling]:
        with self.db.read() as conn:
            rows = conn.execute(select(ceilings).order_by(ceilings.c.device, ceilings.c.dtype)).all()
        return [row_to_ceiling(r) for r in rows]

    @_retried("reading")
    def get(self, key: WorkloadKey) -> R.Recipe | None:
        """The recipe filed exactly under ``key``, or None."""
        with self.db.read() as conn:
            row = conn.execute(select(recipes).where(*_key_where(key))).first()
        return row_to_recipe(row) if row is not None else None

    def show(self, key_or_id: WorkloadKey | Mapping[str, Any] | int | str) -> R.Recipe:
        """One recipe by key (a WorkloadKey or its dict) or by id; KBError if absent."""
        if isinstance(key_or_id, Mapping):
            key_or_id = WorkloadKey.from_dict(key_or_id)
        if isinstance(key_or_id, WorkloadKey):
            got = self.get(key_or_id)
        else:
            try:
                rid = int(key_or_id)
                if not 1 <= rid <= 2**63 - 1:  # SQLite's integer range
                    raise ValueError(rid)
            except (TypeError, ValueError):
                raise KBError(f"KB {self.db.where}: {key_or_id!r} is not a recipe id; expected an integer id "
                              "(see `inferloom kb list`) or a workload key") from None
            with self.db.read() as conn:
                row = conn.execute(select(recipes).where(recipes.c.id == rid)).first()
            got = row_to_recipe(row) if row is not None else None
        if got is None:
            raise KBError(f"KB {self.db.where}: no recipe {key_or_id}; see `inferloom kb list`")
        return got

    @_retried("reading")
    def list_recipes(self, *, with_winner: bool | None = None, status: str | None = None) -> list[R.Recipe]:
        """All recipes ordered by key; optionally only those with (without) a winner, or of a status."""
        q = select(recipes).order_by(*[recipes.c[f] for f in KEY_FIELDS])
        if with_winner is not None:
            q = q.where(recipes.c.ratio.is_not(None) if with_winner else recipes.c.ratio.is_(None))
        if status is not None:
            q = q.where(recipes.c.status == status)
        with self.db.read() as conn:
            return [row_to_recipe(r) for r in conn.execute(q)]

    @_retried("reading")
    def lookup(self, key: WorkloadKey, min_confidence: float = 0.0) -> LookupResult:
        """Relaxed lookup; see :func:`inferloom.kb.lookup.lookup`."""
        return lookup(self, key, min_confidence)

    # ------------------------------------------------------------ export / import
    @_retried("reading")
    def export_document(self) -> dict[str, Any]:
        """Every recipe and ceiling as one JSON-ready document (the format
        :meth:`import_json` reads; the caller writes it to a file)."""
        doc = {"format": EXPORT_FORMAT, "schema_version": SCHEMA_VERSION, "exported_at": time.time(),
               "recipes": [r.to_dict(with_id=False) for r in self.list_recipes()],
               "ceilings": [c.to_dict() for c in self.list_ceilings()]}
        return json.loads(dumps(doc))

    @_retried("importing")
    def import_json(self, path: str | Path) -> ImportResult:
        """Merge an exported document into this KB under the same strict rules
        (an imported winner enters only if its recorded evidence passes them and
        it ranks above the local one; sessions, lessons, failures are unions).
        Importing the same document again changes nothing."""
        return import_document(self, path)
