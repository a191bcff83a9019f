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
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from inferloom.patches.parse import PatchRefusal
from inferloom.patches.policy import PatchPolicy
from inferloom.errors import InferloomError
from inferloom.workloads.base import AdapterError, Knob
from inferloom.workloads.server_adapter import ServerAdapter
from inferloom.workloads.server_start import MemoryShareOnce as _MemoryShareOnce
from inferloom.workloads.vllm_flags import ServerFlags, filter_knobs, probe_server_flags
from inferloom.workloads.vllm_engine_patches import (ENGINE_PATCH_KNOB, build_engine_overlay, engine_patch_knob,
                                                     patch_files)
from inferloom.workloads.vllm_kernel_overlays import OVERLAY_DIR, overlays_for
from inferloom.workloads.vllm_kernel_overlays import plugin_refusal as written_refusal
from inferloom.workloads.vllm_knobs import recovery_options, to_launch, vllm_knobs
from inferloom.workloads.vllm_launch import launch_command, server_distribution
from inferloom.workloads.moe_knobs import config_json, drop_moe_only, moe_only_refusal, vendor_narrowed
from inferloom.workloads.engine_written import knob as written_knob
from inferloom.workloads.vllm_moe_backend import MOE_BACKEND_KNOB, moe_backend_refusal
from inferloom.workloads.vllm_moe_knob import MOE_KNOB, MoEConfigs, moe_refusal
from inferloom.workloads.vllm_plugins import EngineOverlayError, OverlayDir, check_overlays, overlay_key
from inferloom.workloads.vllm_probes import SCORE_APPROXIMATION, greedy_continuations, score_logprobs
from inferloom.workloads.vllm_servers import VLLM_START, MemoryShareOnce, VLLMHandle
from inferloom.workloads.vllm_source_overlay import engine_patch_policy, installed_package

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
    _moe: MoEConfigs | None = None
    launches_overlays = True  # overlays_of (the enablement rung's source overlay too) goes through launch_command
    engine_patch_knob = ENGINE_PATCH_KNOB  # EnginePatches: serving.engine_patches, one source overlay per value

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._sources: dict[str, OverlayDir] = {}  # engine_patch value -> its source overlay (built once)
        self._package: Path | None = None  # the installed vllm package (read once)
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------- the engine's
    def static_knobs(self) -> list[Knob]:
        kv = int(self.spec.serving.env.get("VLLM_CPU_KVCACHE_SPACE", 0))  # 0: each server's derived share
        names = list(patch_files(self.spec.serving.engine_patches))
        return vllm_knobs(self.spec.traffic.concurrency, kv) + ([engine_patch_knob(names)] if names else [])

    def probe_flags(self) -> ServerFlags:
        s = self.spec.serving
        return probe_server_flags(s.python, s.module, self._distribution(), {**os.environ, **s.env})

    def filter(self, knobs: list[Knob], flags: ServerFlags) -> tuple[list[Knob], dict[str, str], dict[str, str]]:
        kept, dropped, notes = filter_knobs(knobs, flags)
        # the MoE knobs off their devices are refused at launch like every device-specific knob (applies_to);
        # on a GPU, a dense model drops them with the reason
        if self.device != "cpu":
            hf = self._hf_config()
            kept, dropped = drop_moe_only(kept, dropped, {MOE_KNOB: moe_refusal(hf, self.device),
                                                          MOE_BACKEND_KNOB: moe_only_refusal(MOE_BACKEND_KNOB, hf)})
            kept, notes = vendor_narrowed(kept, notes, MOE_BACKEND_KNOB, self.spec.serving.python,
                                          {**os.environ, **self.spec.serving.env})
        return kept, dropped, notes

    def _hf_config(self) -> dict[str, Any] | None:
        return config_json(self.model_dir())

    def config_refusal(self, config: Mapping[str, Any]) -> str | None:
        """CrossKnobRules: the base's, tuned Triton MoE configs beside another experts' backend (the server
        would never read them: ``vllm_moe_backend``), and a catalog replacement and a written kernel of one op
        (one plugin, one replacement per op: ``vllm_written``), so the search never proposes those."""
        return super().config_refusal(config) or moe_backend_refusal(config) or written_refusal(config)

    @property
    def _knobs(self) -> list[Knob]:
        """The installed server's knobs, and in a session with the LLM kernel author its ``llm_kernel`` switch
        (its domain the kernels whose gates passed so far: ``vllm_written``), as the in-process engines have."""
        base = ServerAdapter._knobs.fget(self)  # type: ignore[attr-defined]
        llm = self.spec.agents.llm
        return base + [written_knob()] if llm is not None and "kernel_author" in llm.roles else base

    def moe(self) -> MoEConfigs:
        """The fused-MoE config folders of the knob ``moe_configs`` (``vllm_moe_knob``)."""
        if self._moe is None:
            s, t = self.spec.serving, self.spec.traffic
            chunk = next((int(b) for a, b in zip(s.extra_args, s.extra_args[1:]) if a == "--max-num-batched-tokens"
                          and str(b).isdigit()), None)
            self._moe = MoEConfigs(s.python, self._hf_config(), str(self.spec.dtype), t.concurrency, t.input_len,
                                   chunk, s.env.get("VLLM_TUNED_CONFIG_FOLDER"), self.distribution,
                                   self.log_dir() / OVERLAY_DIR, self.progress)
        return self._moe

    def replay_tables(self, tables: Mapping[str, Any]) -> None:
        """``EngineTables``: the fused-MoE configs a KB recipe kept (``{moe_configs: {file: table}}``)."""
        if isinstance(tables.get(MOE_KNOB), Mapping):
            self.moe().replay(tables[MOE_KNOB])

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
        """The overlays a server for ``cfg`` starts with: the source overlay of the stock's enablement rung
        (``engine_ladder``), if any, those set (``set_overlays``), the source overlay its
        ``engine_patch`` knob names (``vllm_engine_patches``), the plugin its ``kernel_plugin`` knob names
        (``vllm_kernel_overlays``) and the fused-MoE config folder its ``moe_configs`` names
        (``vllm_moe_knob``), built under the log directory's ``overlays/``."""
        patch = str(cfg.get(ENGINE_PATCH_KNOB, "none"))
        try:
            source = () if patch == "none" else (self._source(patch),)
        except PatchRefusal as r:
            raise AdapterError(f"{ENGINE_PATCH_KNOB}={patch}: refused ({r.rule}): {r.why}", kind="engine_overlay") from None
        root = self.log_dir() / OVERLAY_DIR
        try:  # a failed tuning pass fails this candidate, not the session
            moe = self.moe().overlays(cfg, root) if str(cfg.get(MOE_KNOB, "stock")) != "stock" else []
        except InferloomError as exc:
            raise AdapterError(f"{MOE_KNOB}={cfg[MOE_KNOB]}: {exc}", kind="engine_overlay") from None
        return self.ladder_overlays(cfg) + self.overlays + source + tuple(overlays_for(cfg, root)) + tuple(moe)

    def _source(self, name: str) -> OverlayDir:
        if name not in self._sources:
            files = patch_files(self.spec.serving.engine_patches)
            if name not in files:
                raise EngineOverlayError(f"{ENGINE_PATCH_KNOB}={name}: no such patch in serving.engine_patches "
                                         f"({', '.join(files) or 'none given'})")
            if self._package is None:
                self._package = installed_package(self.spec.serving.python)
            self._sources[name] = build_engine_overlay(self.log_dir() / OVERLAY_DIR, self._package, name,
                                                       files[name].read_bytes(), files[name])
        return self._sources[name]

    # EnginePatches: the session's gates ask for the policy, then for the isolated copy itself
    def engine_patch_policy(self) -> PatchPolicy:
        return engine_patch_policy("vllm")

    def engine_patch_overlay(self, name: str) -> dict[str, Any]:
        """The source overlay of patch ``name`` (built once; PatchRefusal with the gate's rule), as recorded."""
        return self._source(name).to_dict()

    def pool_key(self, cfg: Mapping[str, Any]) -> str:
        return super().pool_key(cfg) + overlay_key(self.overlays)

    def after_start(self, handle: VLLMHandle, record: dict[str, Any]) -> None:
        try:  # vLLM starts without a plugin it could not load: such a server would measure stock kernels
            record.update(check_overlays(self.overlays_of(handle.config), handle.server.log_path))
            if str(handle.config.get(MOE_KNOB, "stock")) != "stock":  # its MoE layers must have read the folder
                record.update(self.moe().start_record(handle.config, handle.server.log_path))
        except EngineOverlayError as exc:
            self._stop(handle)
            raise AdapterError(f"vLLM server {handle.id}: {exc}", kind="engine_overlay") from None


def from_spec(spec: WorkloadSpec) -> VLLMAdapter:
    return VLLMAdapter(spec)
