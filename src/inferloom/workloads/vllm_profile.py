"""A vLLM server's profile of one configuration, for PRELUDE and the KERNEL phase (``Framework.server_profile``).

:func:`profile_stack` starts a server for ``config`` with vLLM's torch profiler armed and profiles one run
of the spec's traffic (:func:`inferloom.measure.server_profile.profile_server`: ``/start_profile`` ..
``/stop_profile``, the worker's trace read into the same op families as an in-process profile). The server
is its own (the profiler's flags make it a different launch); it is stopped afterwards.

What it costs: a server start and the trace's flush (``measure.server_profile.TRACE_FLUSH_S``, the
estimate ``phases/server_profile.py`` budgets with).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from inferloom.measure.server_profile import profile_server
from inferloom.workloads.vllm_adapter import VLLMAdapter

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["profile_stack"]


def profile_stack(spec: WorkloadSpec, config: Mapping[str, Any], trace_dir: str | Path, log_dir: str | Path | None,
                  progress: Callable[[str], None]) -> dict[str, Any]:
    """See the module docstring: the trace's categories and top ops, the run, how it was taken."""
    return profile_server(spec, dict(config), trace_dir, make_adapter=VLLMAdapter, log_dir=log_dir, progress=progress)
