"""On-disk session storage for ``inferloom optimize``.

A session directory holds three files, each with its own module:

* ``state.json`` (:mod:`inferloom.session.state`): the single source of truth
  for where the session is; rewritten atomically after every step. Its typed
  parts (the coordinator's bookkeeping, the trials) are in
  :mod:`inferloom.session.state_models`.
* ``ledger.jsonl`` (:mod:`inferloom.session.ledger`): append-only, fsync'd
  record of everything that happened; survives ``kill -9`` at any point.
* ``manifest.json`` (:mod:`inferloom.session.manifest`): provenance, written
  once when the session starts.

:mod:`inferloom.session.atomic` holds the crash-safe JSON writer they share.
"""
