"""A session directory whose files parse but whose contents have the wrong shape.

The readers (:func:`~inferloom.session.ledger.read_entries`,
:func:`~inferloom.session.state.load_state`,
:func:`~inferloom.session.manifest.read_manifest`) check what every file must
be: UTF-8 JSON within bounds, a ledger with consecutive ``seq`` and a string
``kind`` per line, a typed state, a manifest with a valid spec. A ledger
entry's payload is free-form, read by the report, the export and a resumed
session where they use it: an entry edited to hold a string where a number
was, or with a key removed, fails there as a ``KeyError`` / ``TypeError`` /
... . :func:`damaged_session` turns such a failure of a command that reads a
session directory (``report``, ``export``, ``resume``) into one line, exit 2,
naming the directory, the failure and where it happened.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path

from inferloom.errors import InferloomError

__all__ = ["SessionDataError", "SHAPE_ERRORS", "damaged_session"]

#: What reading a payload of the wrong shape raises.
SHAPE_ERRORS: tuple[type[BaseException], ...] = (
    KeyError, TypeError, AttributeError, IndexError, ValueError, RecursionError, OverflowError, ZeroDivisionError)


class SessionDataError(InferloomError, ValueError):
    """A session file holds data of the wrong shape (an edited or damaged ledger entry): exit 2."""


def damaged_session(directory: str | os.PathLike[str], exc: BaseException) -> SessionDataError:
    """The one-line error for ``exc``, raised while reading the session in ``directory``."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" in {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    what = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
    return SessionDataError(
        f"{directory}: a session file holds data of an unexpected shape ({what}{where}); it was edited or "
        "damaged: restore the session directory from a backup (if nobody edited it, this is an inferloom bug: "
        "please report it with this line)")
