"""One start of a server framework's server, whatever the framework: launch,
wait for health, and what the start taught (startup seconds and where they
went, from the framework's own log lines; a compile cache's state where the
framework has one; the memory settings it got), and the memory share every
server of one adapter gets (:class:`MemoryShareOnce`: read once, before the
first start, so that every server of a pair gets the same share).

The framework-specific parts come in a :class:`StartHooks` (``vllm_servers``,
``sglang_servers``). Used by ``server_adapter``, whose ``handle_pool`` decides
when a server starts.

Inside a session's trial the start-up timeout is also bounded by the budget
(``budget``: the seconds the session has left; :func:`budgeted_timeout`): a
start the budget cuts fails with kind ``budget``, which says nothing about the
configuration. On one H100 (2026-12-06) a trial begun with 1.9 minutes left
spent the 600 s ``serving.startup_timeout_s`` in one server start, and the
12-minute session took 20.4.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping

from inferloom.workloads.base import AdapterError
from inferloom.workloads.memory_share import MemoryShare, MemoryShareError
from inferloom.workloads.server_launch import rejected_flag_info
from inferloom.workloads.server_process import LaunchError, ServerProcess
from inferloom.workloads.server_says import nothing_said

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["ServerHandle", "StartHooks", "MemoryShareOnce", "start_server", "budgeted_timeout", "START_FLOOR_S"]

#: the least a start gets when a session's budget bounds it: normal starts fit (56-93 s to healthy on an H100, 2026-12-06)
START_FLOOR_S = 120.0

MemoryArgs = Callable[..., "tuple[list[str], dict[str, str], dict[str, str]]"]


@dataclass
class ServerHandle:
    id: str
    config: dict[str, Any]
    config_id: str
    server: ServerProcess
    startup_s: float
    released: bool = False
    notes: dict[str, Any] = field(default_factory=dict)


def _no_cache(env: Mapping[str, str]) -> Any:
    return None


def _no_cache_state(env: Mapping[str, str], before: Any, cfg: Mapping[str, Any], argv: list[str]) -> dict[str, Any]:
    return {"warm": None}


@dataclass(frozen=True)
class StartHooks:
    """What one framework adds to a start: its name in progress lines, where its start-up went
    (``split(log_text, startup_s)`` -> ``{"parts": ..., "stated": ...}``, ``split_text(parts)``), its compile
    cache (``cache_before(env)`` before the launch, ``cache_after(env, before, cfg, argv)`` -> a dict with
    ``warm``: True / False / None), and the memory variables the start records."""

    label: str
    split: Callable[[str, float], dict[str, Any]]
    split_text: Callable[[dict[str, float]], str]
    cache_before: Callable[[Mapping[str, str]], Any] = _no_cache
    cache_after: Callable[[Mapping[str, str], Any, Mapping[str, Any], list[str]], dict[str, Any]] = _no_cache_state
    memory_env: tuple[str, ...] = ()
    says: Callable[[str], dict[str, tuple[Any, str]]] = nothing_said  # server_says: what its log says it runs


class MemoryShareOnce:
    """Each server's share of the device's memory (``memory_share``), read on
    first use and kept: ``get()`` the share (None: not derived, ``why``
    says why), ``args(cfg, flags)`` what it adds to one launch, ``record()``
    what ``describe`` reports (a spec value that wins is listed there).
    ``derive(spec, device, model_dir)`` and ``memory_args(spec, cfg, share, flags, device)``: the framework's."""

    def __init__(self, spec: WorkloadSpec, device: str, model_dir: Callable[[], str], progress: Callable[[str], None],
                 derive: Callable[..., MemoryShare | None], memory_args: MemoryArgs, label: str) -> None:
        self.spec, self.device, self._model_dir, self._progress = spec, device, model_dir, progress
        self._derive, self._memory_args, self._label = derive, memory_args, label
        self._read = False
        self._share: MemoryShare | None = None
        self.why: str | None = None
        self._oom = False

    def get(self) -> MemoryShare | None:
        if not self._read:
            self._read = True
            try:
                self._share = self._derive(self.spec, self.device, self._model_dir())
                self.why = None if self._share else "the spec sets every memory setting"
            except (MemoryShareError, OSError) as exc:
                self.why, self._oom = str(exc), "do not fit" in str(exc)
            self._progress(f"memory share: {self.said(self._share)}" if self._share
                           else f"memory share not derived: {self.why}")
        return self._share

    def said(self, share: MemoryShare) -> str:
        """The share's progress line (a framework's subclass adds the flag that gives it)."""
        return share.summary()

    def args(self, cfg: Mapping[str, Any], server_flags: Collection[str] | None
             ) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """``memory_args`` for ``cfg``; AdapterError (``oom``) when a pair does not fit."""
        share = self.get()
        if share is None and self._oom:
            raise AdapterError(f"{self._label}: {self.why}", kind="oom")
        return self._memory_args(self.spec, cfg, share, server_flags, self.device)

    def record(self) -> dict[str, Any]:
        """The share (once read: the first server start reads it), and the memory settings the spec gives."""
        decided = self._memory_args(self.spec, {}, None, None, self.device)[2]
        spec = {k: v for k, v in decided.items() if v.startswith("spec")}
        sh = self._share
        return {"derived": sh.to_dict() if sh else None,
                "why_not": self.why if self._read else "read at the first server start", "from_spec": spec}


def start_server(hid: str, cfg: dict[str, Any], cid: str, launch: tuple[list[str], dict[str, str], dict[str, Any]],
                 port: int, log_path: Path, timeout_s: float, progress: Callable[[str], None],
                 rejected_flags: dict[str, dict[str, Any]], reason: str = "new", share: MemoryShare | None = None,
                 *, hooks: StartHooks, budget: Callable[[], float | None] | None = None) -> tuple[ServerHandle, dict[str, Any]]:
    """Start one server and wait for ``/health``: ``(handle, record)``. A
    failed launch is AdapterError with its kind; a flag the server rejected is
    learned into ``rejected_flags``. ``share``: the memory share, recorded.
    ``budget``: the seconds a session has left (:func:`budgeted_timeout`)."""
    argv, env, origin = launch
    label = hooks.label
    cache0 = hooks.cache_before(env)
    server = ServerProcess(argv, env, port, log_path)
    wait, cut = budgeted_timeout(timeout_s, budget)
    progress(f"starting {label} server {hid} on port {port} (log {server.log_path})"
             + ("" if reason == "new" else f" ({reason})")
             + (f" (start-up cut at {wait:.0f} s: the session's budget is nearly used)" if cut else ""))
    try:
        startup = server.start(wait, progress)
    except LaunchError as exc:
        if exc.kind == "unsupported_flag" and exc.flag:
            rejected_flags[exc.flag] = rejected_flag_info(exc, origin)
        if cut and exc.kind == "startup_timeout":
            raise AdapterError(f"{label} server for {hid} was not healthy within the {wait:.0f} s the session's budget "
                               f"left its start (serving.startup_timeout_s: {timeout_s:g} s): cut by the budget, not a "
                               f"verdict on the configuration; a session with more minutes measures it. Log "
                               f"{server.log_path}\n{exc.log_tail[-1500:]}", kind="budget") from None
        raise AdapterError(f"{label} server for {hid} failed to start: {exc}\n{exc.log_tail[-1500:]}",
                           kind=exc.kind) from None
    cache = hooks.cache_after(env, cache0, cfg, argv)
    try:  # where the start-up went, and what it runs, from the server's own log lines
        text = server.log_path.read_text(errors="replace")
        split, says = hooks.split(text, startup), hooks.says(text)
    except OSError:
        split, says = None, {}
    progress(f"{label} server {hid} healthy after {startup:.1f} s"
             + ("" if cache.get("warm") is None else f" (compile cache {'warm' if cache['warm'] else 'cold'})")
             + (f": {hooks.split_text(split['parts'])}" if split else ""))
    h = ServerHandle(hid, cfg, cid, server, startup, notes={"log": str(server.log_path), "argv": argv})
    return h, {"server_startup_s": startup, "startup_split": split, "compile_cache": cache,
               "memory": origin.get("memory", {}),
               "memory_share": share.to_dict() if share is not None else None,
               "memory_env": {k: env[k] for k in hooks.memory_env if k in env},
               "log": server.log_path.name, "port": port, "says": {k: list(v) for k, v in says.items()},
               **({"overlays": origin["overlays"]} if origin.get("overlays") else {}),
               **({"engine_env": origin["engine_env"]} if origin.get("engine_env") else {})}


def budgeted_timeout(timeout_s: float, budget: Callable[[], float | None] | None) -> tuple[float, bool]:
    """A start's timeout under a session's budget: ``(seconds, cut)``. ``budget()`` gives the seconds the
    session has left (None: unbounded); the start gets the spec's ``timeout_s`` or that time, whichever is
    less, but at least :data:`START_FLOOR_S`; ``cut`` when the budget shortened it."""
    left = budget() if budget is not None else None
    if left is None or max(float(left), START_FLOOR_S) >= timeout_s:
        return timeout_s, False
    return max(float(left), START_FLOOR_S), True
