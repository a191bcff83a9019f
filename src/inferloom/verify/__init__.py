"""``inferloom verify``: an independent re-derivation of a session's headline numbers from its ledger.

Shares nothing with the computing path (:mod:`inferloom.measure`, :mod:`inferloom.report`,
:mod:`inferloom.phases`) but the ledger reader; see :mod:`inferloom.verify.session`."""

from inferloom.verify.record import Check, Findings, VerifyError
from inferloom.verify.session import load_session, verify_session
from inferloom.verify.bundle import verify_path

__all__ = ["Check", "Findings", "VerifyError", "load_session", "verify_session", "verify_path"]
