"""The vLLM adapter's servers: one start (:func:`start_server`: launch, wait
for health, what the start taught: startup seconds and where they went
(``vllm_startup``), whether vLLM's compile cache was warm, the memory
settings it got) and the memory share every
server of this adapter gets (:class:`MemoryShareOnce`: read once, before the
first start, so that every server of a pair gets the same share).

Used by ``vllm_adapter``, whose ``handle_pool`` decides when a server starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping

from inferloom.workloads.base import AdapterError
from inferloom.workloads.memory_share import MemoryShare, MemoryShareError
from inferloom.workloads.vllm_startup import split_text, startup_split
from inferloom.workloads.server_process import LaunchError, ServerProcess
from inferloom.workloads.vllm_launch import (
    compile_cache_entries,
    compile_cache_state,
    derive_memory_share,
    memory_args,
    rejected_flag_info,
)

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["VLLMHandle", "MemoryShareOnce", "start_server"]


@dataclass
class VLLMHandle:
    id: str
    config: dict[str, Any]
    config_id: str
    server: ServerProcess
    startup_s: float
    released: bool = False
    notes: dict[str, Any] = field(default_factory=dict)


class MemoryShareOnce:
    """Each server's share of the device's memory (``memory_share``), read on
    first use and kept: ``get()`` the share (None: not derived, ``why``
    says why), ``args(cfg, flags)`` what it adds to one launch, ``record()``
    what ``describe`` reports (a spec value that wins is listed there)."""

    def __init__(self, spec: WorkloadSpec, device: str, model_dir: Callable[[], str], progress: Callable[[str], None]) -> None:
        self.spec, self.device, self._model_dir, self._progress = spec, device, model_dir, progress
        self._read = False
        self._share: MemoryShare | None = None
        self.why: str | None = None
        self._oom = False

    def get(self) -> MemoryShare | None:
        if not self._read:
            self._read = True
            try:
                self._share = derive_memory_share(self.spec, self.device, self._model_dir())
                self.why = None if self._share else "the spec sets every memory setting"
            except (MemoryShareError, OSError) as exc:
                self.why, self._oom = str(exc), "do not fit" in str(exc)
            self._progress(f"memory share: {self._share.summary()}" if self._share
                           else f"memory share not derived: {self.why}")
        return self._share

    def args(self, cfg: Mapping[str, Any], server_flags: Collection[str] | None
             ) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """``memory_args`` for ``cfg``; AdapterError (``oom``) when a pair does not fit."""
        share = self.get()
        if share is None and self._oom:
            raise AdapterError(f"vLLM: {self.why}", kind="oom")
        return memory_args(self.spec, cfg, share, server_flags, self.device)

    def record(self) -> dict[str, Any]:
        """The share (once read: the first server start reads it), and the memory settings the spec gives."""
        spec = {k: v for k, v in memory_args(self.spec, {}, None, None, self.device)[2].items() if v.startswith("spec")}
        sh = self._share
        return {"derived": sh.to_dict() if sh else None,
                "why_not": self.why if self._read else "read at the first server start", "from_spec": spec}


def start_server(hid: str, cfg: dict[str, Any], cid: str, launch: tuple[list[str], dict[str, str], dict[str, Any]],
                 port: int, log_path: Path, timeout_s: float, progress: Callable[[str], None],
                 rejected_flags: dict[str, dict[str, Any]], reason: str = "new", share: MemoryShare | None = None,
                 ) -> tuple[VLLMHandle, dict[str, Any]]:
    """Start one server and wait for ``/health``: ``(handle, record)``. A
    failed launch is AdapterError with its kind; a flag the server rejected is
    learned into ``rejected_flags``. ``share``: the memory share, recorded."""
    argv, env, origin = launch
    cache0 = compile_cache_entries(env)
    server = ServerProcess(argv, env, port, log_path)
    progress(f"starting vLLM server {hid} on port {port} (log {server.log_path})" + ("" if reason == "new" else f" ({reason})"))
    try:
        startup = server.start(timeout_s, progress)
    except LaunchError as exc:
        if exc.kind == "unsupported_flag" and exc.flag:
            rejected_flags[exc.flag] = rejected_flag_info(exc, origin)
        raise AdapterError(f"vLLM server for {hid} failed to start: {exc}\n{exc.log_tail[-1500:]}",
                           kind=exc.kind) from None
    cache = compile_cache_state(env, cache0, compiled=not cfg.get("enforce_eager") and "--enforce-eager" not in argv)
    try:  # where the start-up went, from the server's own log lines (vllm_startup)
        split = startup_split(server.log_path.read_text(errors="replace"), startup)
    except OSError:
        split = None
    progress(f"vLLM server {hid} healthy after {startup:.1f} s"
             + ("" if cache["warm"] is None else f" (compile cache {'warm' if cache['warm'] else 'cold'})")
             + (f": {split_text(split['parts'])}" if split else ""))
    h = VLLMHandle(hid, cfg, cid, server, startup, notes={"log": str(server.log_path), "argv": argv})
    return h, {"server_startup_s": startup, "startup_split": split, "compile_cache": cache,
               "memory": origin.get("memory", {}),
               "memory_share": share.to_dict() if share is not None else None,
               "memory_env": {k: env[k] for k in ("VLLM_CPU_KVCACHE_SPACE",) if k in env},
               "log": server.log_path.name, "port": port,
               **({"overlays": origin["overlays"]} if origin.get("overlays") else {})}
