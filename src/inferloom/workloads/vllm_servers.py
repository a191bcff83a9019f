"""The vLLM adapter's servers: :mod:`inferloom.workloads.server_start` with
vLLM's parts (:data:`VLLM_START`): where a start-up went (``vllm_startup``),
whether vLLM's torch.compile cache was warm, ``VLLM_CPU_KVCACHE_SPACE`` as the
recorded memory variable; and the memory share by vLLM's flags
(:class:`MemoryShareOnce`: ``vllm_launch.derive_memory_share`` / ``memory_args``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from inferloom.workloads import server_start as _ss
from inferloom.workloads.memory_share import MemoryShare
from inferloom.workloads.server_start import ServerHandle, StartHooks
from inferloom.workloads.vllm_launch import (
    compile_cache_entries,
    compile_cache_state,
    derive_memory_share,
    memory_args,
)
from inferloom.workloads.vllm_startup import says, split_text, startup_split

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["VLLMHandle", "VLLM_START", "MemoryShareOnce", "start_server"]

VLLMHandle = ServerHandle


def _cache_after(env: Mapping[str, str], before: Any, cfg: Mapping[str, Any], argv: list[str]) -> dict[str, Any]:
    return compile_cache_state(env, before, compiled=not cfg.get("enforce_eager") and "--enforce-eager" not in argv)


VLLM_START = StartHooks("vLLM", startup_split, split_text, compile_cache_entries, _cache_after,
                        memory_env=("VLLM_CPU_KVCACHE_SPACE",), says=says)


class MemoryShareOnce(_ss.MemoryShareOnce):
    """``server_start.MemoryShareOnce`` by vLLM's memory flags and ``VLLM_CPU_KVCACHE_SPACE``."""

    def __init__(self, spec: WorkloadSpec, device: str, model_dir: Callable[[], str],
                 progress: Callable[[str], None]) -> None:
        super().__init__(spec, device, model_dir, progress, derive_memory_share, memory_args, "vLLM")

    def said(self, share: MemoryShare) -> str:
        """With the vLLM value that gives the share: ``VLLM_CPU_KVCACHE_SPACE`` on a CPU, else
        ``--gpu-memory-utilization``."""
        if share.device == "cpu":
            return share.summary() + f" (VLLM_CPU_KVCACHE_SPACE={share.kv_cache_space_gib})"
        return share.summary() + f" (--gpu-memory-utilization {share.gpu_memory_utilization})"


def start_server(hid: str, cfg: dict[str, Any], cid: str, launch: tuple[list[str], dict[str, str], dict[str, Any]],
                 port: int, log_path: Path, timeout_s: float, progress: Callable[[str], None],
                 rejected_flags: dict[str, dict[str, Any]], reason: str = "new", share: MemoryShare | None = None,
                 ) -> tuple[ServerHandle, dict[str, Any]]:
    """One vLLM server start (``server_start.start_server`` with :data:`VLLM_START`)."""
    return _ss.start_server(hid, cfg, cid, launch, port, log_path, timeout_s, progress, rejected_flags, reason,
                            share, hooks=VLLM_START)
