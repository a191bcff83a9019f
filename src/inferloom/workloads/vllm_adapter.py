"""WorkloadAdapter for a vLLM OpenAI-compatible server run as a subprocess.

The server process, reuse, memory shares, the timed run (warm-up, quiet
wait, the streaming load generator), prompts and traces and the rejected-flag
learning are the server-framework base's (``server_adapter``); this module
supplies vLLM's parts:

* the launch line (``vllm_launch``: ``--model``, ``--served-model-name``,
  ``--max-model-len``, ``--max-logprobs``, ...) with the memory share as
  ``--gpu-memory-utilization`` / ``--kv-cache-memory-bytes`` on GPUs and
  ``VLLM_CPU_KVCACHE_SPACE`` on CPU (a spec value or the candidate's own knob
  wins: ``vllm_launch.memory_args``);
* the knob table (``vllm_knobs``) cut to the installed server's ``--help=all``
  (``vllm_flags``), its recovery options, ``max_num_seqs`` as the
  sequences-per-step cap;
* where a start-up went (``vllm_startup``) and whether the torch.compile cache
  was warm (``vllm_servers``);
* the quality probes (``vllm_probes``): ``greedy`` and ``score`` (top-k prompt
  log-probabilities) one request per prompt, ``quality.concurrency`` in
  flight; ``*_batched``: all prompts in one request (the batched guard).

Paired A/B on a small CPU machine: both servers of a comparison stay up and
only one receives load at a time; each run records the CPU seconds the other
live servers burnt meanwhile (``extra['idle_servers_cpu_s']``, docs/loadgen.md).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from inferloom.workloads.base import AdapterError, Knob
from inferloom.workloads.server_adapter import ServerAdapter
from inferloom.workloads.server_start import MemoryShareOnce as _MemoryShareOnce
from inferloom.workloads.vllm_flags import ServerFlags, filter_knobs, probe_server_flags
from inferloom.workloads.vllm_kernel_overlays import OVERLAY_DIR, overlays_for
from inferloom.workloads.vllm_knobs import recovery_options, to_launch, vllm_knobs
from inferloom.workloads.vllm_launch import launch_command, server_distribution
from inferloom.workloads.vllm_plugins import EngineOverlayError, OverlayDir, check_overlays, overlay_key
from inferloom.workloads.vllm_probes import SCORE_APPROXIMATION, greedy_continuations, score_logprobs
from inferloom.workloads.vllm_servers import VLLM_START, MemoryShareOnce, VLLMHandle

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["VLLMAdapter", "VLLMHandle", "from_spec"]


class VLLMAdapter(ServerAdapter):
    name = "vllm"
    label = "vLLM"
    seqs_knob = "max_num_seqs"
    to_launch = staticmethod(to_launch)
    start_hooks = VLLM_START
    probe_greedy = staticmethod(greedy_continuations)
    probe_score = staticmethod(score_logprobs)
    score_note = SCORE_APPROXIMATION
    recovery_table = staticmethod(recovery_options)
    server_profiler = "vllm"  # /start_profile .. /stop_profile (measure/server_profile.py)

    overlays: tuple[OverlayDir, ...] = ()  # engine overlays the next servers start with (set_overlays)

    # ------------------------------------------------------- the engine's
    def static_knobs(self) -> list[Knob]:
        kv = int(self.spec.serving.env.get("VLLM_CPU_KVCACHE_SPACE", 0))  # 0: each server's derived share
        return vllm_knobs(self.spec.traffic.concurrency, kv)

    def probe_flags(self) -> ServerFlags:
        s = self.spec.serving
        return probe_server_flags(s.python, s.module, self._distribution(), {**os.environ, **s.env})

    def filter(self, knobs: list[Knob], flags: ServerFlags) -> tuple[list[Knob], dict[str, str], dict[str, str]]:
        return filter_knobs(knobs, flags)

    def make_memory(self) -> _MemoryShareOnce:
        return MemoryShareOnce(self.spec, self.device, self.model_dir, lambda m: self.progress(m))

    def distribution(self) -> str:
        return server_distribution(self.spec.serving.python)

    def launch_argv(self, cfg: Mapping[str, Any], port: int) -> tuple[list[str], dict[str, str], dict[str, Any]]:
        """The server's ``(argv, env, origin)`` for ``cfg`` on ``port`` (see ``vllm_launch``) with its
        memory share; ``origin["memory"]`` says where each memory setting came from."""
        flags = self.server_flags().flags
        argv, env, origin = launch_command(self.spec, self.model_dir(), cfg, port, flags, self._trace.longest(),
                                           self.overlays_of(cfg))
        args, env_m, decided = self._memory.args(cfg, None if flags is None else flags - set(self.rejected_flags))
        return argv + args, {**env, **env_m}, {**origin, "memory": decided}

    # ------------------------------------------------------ engine overlays
    def set_overlays(self, overlays: Sequence[OverlayDir] = ()) -> None:
        """The engine overlays (``vllm_plugins``: kernel plugins, source patches) of the servers prepared from
        now on; () for none (rollback). A server's identity includes them: none is reused across overlays."""
        self.overlays = tuple(overlays)

    def overlays_of(self, cfg: Mapping[str, Any]) -> tuple[OverlayDir, ...]:
        """The overlays a server for ``cfg`` starts with: those set (``set_overlays``) and the one its
        ``kernel_plugin`` knob names (``vllm_kernel_overlays``, built under the log directory's ``overlays/``)."""
        return self.overlays + tuple(overlays_for(cfg, self.log_dir() / OVERLAY_DIR))

    def pool_key(self, cfg: Mapping[str, Any]) -> str:
        return super().pool_key(cfg) + overlay_key(self.overlays)

    def after_start(self, handle: VLLMHandle, record: dict[str, Any]) -> None:
        try:  # vLLM starts without a plugin it could not load: such a server would measure stock kernels
            record.update(check_overlays(self.overlays_of(handle.config), handle.server.log_path))
        except EngineOverlayError as exc:
            self._stop(handle)
            raise AdapterError(f"vLLM server {handle.id}: {exc}", kind="engine_overlay") from None


def from_spec(spec: WorkloadSpec) -> VLLMAdapter:
    return VLLMAdapter(spec)
