"""Build a session's LLM-backed agents from ``spec.agents.llm``.

:func:`llm_agents` returns the fields of the session's
:class:`~inferloom.phases.context.Agents` that the LLM takes over (only the
roles ``agents.llm.roles`` names; the others stay deterministic) and ``llm``,
the session's :class:`~inferloom.agents.llm_client.LLMClient` (the coordinator
reads its budget). The ``specialist`` role makes the LLM a custom workload's
patch source (in place of ``custom.patches``' directory and command); the
``kernel_author`` (:mod:`inferloom.agents.llm_kernel`) writes kernels in the
KERNEL phase (``phases/kernel_llm.py``; the kernels a resumed session's gates
passed are registered again here). With ``replay`` (``optimize --llm-replay SESSION_DIR``) the
recorded session's replies answer instead: no key, no network.

A spec that asks for an LLM without a usable key or SDK is refused before the
session runs (:class:`LLMSetupError`, exit 2, saying what to set).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping

from inferloom.agents.llm_client import LLMClient, make_transport
from inferloom.agents.llm_kernel import LLMKernelAuthor
from inferloom.agents.llm_record import LLMRefusal, ReplayTransport, read_exchanges
from inferloom.agents.llm_roles import LLMCritic, LLMOrchestrator
from inferloom.agents.llm_specialist import LLMPatchSource
from inferloom.errors import InferloomError
from inferloom.kernels.written_set import restore

__all__ = ["LLMSetupError", "llm_agents", "check_llm"]


class LLMSetupError(InferloomError, ValueError):
    """``agents.llm`` can't be used here (no key in its variable, no SDK, nothing to replay)."""


def check_llm(llm: Any, replay: str | None, environ: Mapping[str, str] = os.environ) -> None:
    """Raise :class:`LLMSetupError` (one line, what to do) unless ``llm`` can be used."""
    try:
        if replay is not None:
            ReplayTransport(replay)
        else:
            make_transport(llm, environ)
    except LLMRefusal as exc:
        raise LLMSetupError(f"agents.llm ({llm.provider}, {llm.model}): {exc.why}") from None
    except ValueError as exc:
        raise LLMSetupError(str(exc)) from None


def llm_agents(llm: Any, directory: str | os.PathLike[str], replay: str | None,
               load_view: Callable[[], Mapping[str, Any]], environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The :class:`~inferloom.phases.context.Agents` fields the LLM plays (see the module docstring)."""
    check_llm(llm, replay, environ)
    used = Counter(str(r.get("role")) for r in read_exchanges(directory))  # a resumed session's calls so far
    transport = ReplayTransport(replay, used) if replay is not None else make_transport(llm, environ)
    client = LLMClient(llm, transport, Path(directory), replayed_from=str(replay) if replay is not None else None)
    out: dict[str, Any] = {"llm": client}
    if "orchestrator" in llm.roles:
        out["orchestrator"] = LLMOrchestrator(client)
    if "critic" in llm.roles:
        out["critic_factory"] = lambda: LLMCritic(client, load_view)
    if "specialist" in llm.roles:  # a custom workload's patches: the LLM is its patch source
        out["patch_source"] = LLMPatchSource(client)
    if "kernel_author" in llm.roles:
        restore(directory)
        out["kernel_author"] = LLMKernelAuthor(client, directory)
    return out
