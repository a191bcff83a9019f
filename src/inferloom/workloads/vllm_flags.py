"""The installed vLLM server's flags, read from its own ``--help``, and the
knob space cut down to them: :mod:`inferloom.workloads.server_flags` bound to
vLLM's tables.

* :func:`probe_server_flags`: runs ``PYTHON -m MODULE --help=all`` (vLLM >=
  0.10 pages its help by config group; ``=all`` lists every group and each
  flag's aliases), else plain ``--help`` (its usage block still lists every
  long option), once per (python, module, server version) in this process.
* :func:`knob_flags` / :func:`filter_knobs`: with :func:`~inferloom.workloads.vllm_knobs.to_launch`,
  its environment fallbacks (``ENV_FALLBACK``) and verbatim choices (``VERBATIM_CHOICES``).
"""

from __future__ import annotations

from typing import Iterable, Mapping

from inferloom.workloads import server_flags as _sf
from inferloom.workloads.base import Knob
from inferloom.workloads.server_flags import HELP_TIMEOUT_S, ServerFlags, clear_cache, parse_help
from inferloom.workloads.vllm_knobs import ENV_FALLBACK, VERBATIM_CHOICES, to_launch

__all__ = ["HELP_TIMEOUT_S", "HELP_OPTIONS", "ServerFlags", "parse_help", "probe_server_flags", "knob_flags",
           "filter_knobs", "clear_cache"]

#: tried in order; the first that exits 0 with options in its output wins
HELP_OPTIONS = ("--help=all", "--help")


def probe_server_flags(python: str, module: str, version: str, env: Mapping[str, str] | None = None,
                       timeout_s: float = HELP_TIMEOUT_S) -> ServerFlags:
    """The server's flags from ``python -m module --help=all`` (else ``--help``),
    cached per ``(python, module, version)``; never raises."""
    return _sf.probe_server_flags(python, module, version, env, timeout_s, HELP_OPTIONS)


def knob_flags(knobs: Iterable[Knob]) -> dict[str, tuple[str, ...]]:
    """knob -> the flags vLLM's ``to_launch`` emits for it at any non-default value."""
    return _sf.knob_flags(knobs, to_launch)


def filter_knobs(knobs: Iterable[Knob], server: ServerFlags) -> tuple[list[Knob], dict[str, str], dict[str, str]]:
    """``(kept, dropped, notes)`` of vLLM's knobs for the installed server (``server_flags.filter_knobs``)."""
    return _sf.filter_knobs(knobs, server, to_launch, ENV_FALLBACK, VERBATIM_CHOICES)
