"""The one base of inferloom's errors, and what the CLI's exit code is for each.

Every public error class derives from :class:`InferloomError` and keeps its
builtin base as a second base (``class SpecError(InferloomError, ValueError)``),
so ``except ValueError`` code written before this base existed still catches it.
The classes stay in the modules that raise them; this module imports nothing
from inferloom, so any module may import it.

``exit_code`` says who must act:

* 2 (:data:`EXIT_BAD_INPUT`): bad input, usage or configuration the user must
  fix (a spec, a flag, a damaged session file, a KB that can't be used). The CLI
  prints ``inferloom CMD: error: MSG``.
* 1 (:data:`EXIT_RUN_FAILED`): the run itself failed (a configuration could not
  be prepared or run, a server did not start, a Specialist command failed). The
  CLI prints ``inferloom CMD: failed (KIND): MSG.`` (``KIND`` when the error has
  a ``kind``), then the class's ``hint`` when it has one.

Internal control-flow exceptions (a gate's :class:`~inferloom.patches.parse.PatchRefusal`,
an LLM's or a guard's refusal) are not InferloomErrors and are not named ``*Error``:
they are always caught where they are raised and become data, and one that escaped
would be a bug that should show its traceback. Every class named ``*Error`` is an
InferloomError (or private), even one that is always caught where it is raised
(the engine's token-count check: exit 1 if it ever escaped).
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["InferloomError", "EXIT_BAD_INPUT", "EXIT_RUN_FAILED"]

EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 1


class InferloomError(Exception):
    """Base of every error inferloom raises for a user to read. The message is
    one line: what is wrong and, where it helps, what to do."""

    exit_code: ClassVar[int] = EXIT_BAD_INPUT
    #: what to do, appended to a failed run's message (exit 1) by the CLI
    hint: ClassVar[str] = ""

