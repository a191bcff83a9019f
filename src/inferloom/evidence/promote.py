"""``inferloom promote SESSION_DIR --by NAME``: a person's approval of a session's winner.

inferloom never promotes on its own: this runs only from the command a person types. It records
who, when, an optional note and the bundle's hash (:func:`inferloom.verify.sums.bundle_hash`: the
manifest and the ledger less its promotion entries) in two places: the session's ledger (a
``promotion`` entry, appended through the one-writer ledger) and the KB (``--kb``, else the one the
session filed its recipe in, else ``$INFERLOOM_KB`` or the default: the recipe's winner becomes
this session's, marked promoted: shown by ``kb list`` / ``kb show``, preferred by lookups, replaced
only by another promotion; :meth:`inferloom.kb.RecipeStore.promote`).

Refused, one line each (:class:`PromoteError`, exit 2), nothing written:

* a session that is not closed (phase other than DONE), or whose ledger another process holds (it is
  running);
* a session without a winner by the KB's strict rules (no paired final comparison kept with held-out
  quality passed, or a final stack equal to stock): the rule it failed and why;
* ``--bundle-hash`` given and the session's files no longer hash to it (they changed since review);
* an empty or multi-line ``--by``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from inferloom.errors import InferloomError
from inferloom.kb import RecipeStore, WorkloadKey
from inferloom.kb.recipe import winner_from_breakdown
from inferloom.redact import has_redacted_password
from inferloom.report.breakdown import breakdown_from_ledger
from inferloom.session import ledger as L
from inferloom.session.manifest import read_manifest
from inferloom.session.state import Phase, load_state
from inferloom.verify.sums import PROMOTION_KIND, bundle_hash

__all__ = ["PromoteError", "promote_session", "promotions"]

_MAX_NAME = 200
_MAX_NOTE = 2000


class PromoteError(InferloomError, ValueError):
    """The session can't be promoted (what, why, what to do): exit 2, nothing written."""


def promotions(directory: str | Path) -> list[dict[str, Any]]:
    """The session's promotion entries, oldest first."""
    return L.read_entries(directory, PROMOTION_KIND)


def _clean(text: str | None, flag: str, cap: int, required: bool) -> str | None:
    t = (text or "").strip()
    if not t:
        if required:
            raise PromoteError(f"{flag}: expected the name of the person approving (for example {flag} 'Ada Lovelace')")
        return None
    if "\n" in t or "\r" in t or len(t) > cap:
        raise PromoteError(f"{flag}: one line of at most {cap} characters, got {len(t)} characters"
                           + (" over several lines" if "\n" in t or "\r" in t else ""))
    return t


def promote_session(directory: str | Path, *, by: str, note: str | None = None, kb_url: str | None = None,
                    expected_hash: str | None = None, clock: Any = time.time) -> dict[str, Any]:
    """Promote the winner of the closed session in ``directory`` (see the module docstring); returns
    the promotion record (``by``, ``at``, ``note``, ``bundle_hash``, ``session_id``, ``recipe_id``, ``ratio``)."""
    d = Path(directory).absolute()
    who = _clean(by, "--by", _MAX_NAME, True)
    why = _clean(note, "--note", _MAX_NOTE, False)
    manifest = read_manifest(d)
    st = load_state(d)
    if st.phase != Phase.DONE:
        raise PromoteError(f"{d}: session {st.session_id} is not closed (phase {st.phase.value}): a running or "
                           f"unfinished session can't be promoted; let it finish (or `inferloom resume {d}`), "
                           "then promote it (nothing was written)")
    digest = bundle_hash(d)
    if expected_hash is not None and expected_hash.strip() != digest:
        raise PromoteError(f"{d}: the bundle hashes to {digest}, not the --bundle-hash {expected_hash.strip()} you "
                           "reviewed: the session's manifest or ledger changed since (or the hash is another "
                           "session's); export and review it again (nothing was written)")
    try:
        ledger = L.Ledger(d)  # the one-writer lock: a running session holds it
    except L.LedgerError as exc:
        raise PromoteError(f"{d}: the ledger can't be opened for writing ({exc}); a session still running "
                           "can't be promoted (nothing was written)") from None
    try:
        b = breakdown_from_ledger(ledger.entries())
        now = float(clock())
        winner, code, reason = winner_from_breakdown(b, st.session_id, now)
        if winner is None:
            raise PromoteError(f"{d}: session {st.session_id} has no winner to promote ({code}: {reason}); only a "
                               "final stack kept against stock with held-out quality passed can be promoted "
                               "(nothing was written)")
        record = {"by": who, "at": now, "note": why, "bundle_hash": digest, "session_id": st.session_id}
        key = WorkloadKey.from_session(manifest, st)
        stored = st.extra.run_options.kb_url if st.extra.run_options is not None else None
        if kb_url is None and stored and not has_redacted_password(stored):
            kb_url = stored  # the KB the session filed its recipe in (else $INFERLOOM_KB or the default)
        with RecipeStore(kb_url) as store:
            rec = store.promote(key, winner, record)
            where = store.db.where
        entry = {**record, "recipe_id": rec.id, "kb": where, "workload_key": key.to_dict(), "ratio": winner["ratio"],
                 "ci_low": winner["ci_low"], "ci_high": winner["ci_high"], "changes": winner["changes"],
                 "final_ledger_seq": winner["evidence"]["ledger_seq"]}
        entry["seq"] = ledger.append(PROMOTION_KIND, entry)
        return entry
    finally:
        ledger.close()
