"""WorkloadAdapter for an SGLang server (``python -m sglang.launch_server``) run as a subprocess.

The server process, reuse, memory shares, the timed run over SGLang's
OpenAI-compatible ``/v1/completions`` (warm-up, quiet wait, the streaming
load generator), prompts and traces and the rejected-flag learning are the
server-framework base's (``server_adapter``); this module supplies SGLang's parts:

* the launch line (``sglang_launch``), from ``serving.python``'s own environment
  (``serving.module`` defaults to ``sglang.launch_server`` for this framework), the
  memory share as ``--mem-fraction-static`` and ``--max-total-tokens``;
* the knob table (``sglang_knobs``, issue 32's list) cut to the installed
  server's ``--help`` (``server_flags``, with SGLang's tables; ``moe_runner_backend`` dropped for a dense
  model: ``moe_knobs``), its recovery
  options, ``max_running_requests`` as the sequences-per-step cap;
* where a start-up went (``sglang_startup``: SGLang's own log lines);
* the quality probes (``sglang_probes``: the native ``/generate`` API's
  ``output_ids`` and ``return_logprob`` / ``top_logprobs_num`` / ``logprob_start_len``).

A server environment without SGLang is one line (``unsupported``) before any
launch; a flag the server refuses and an out-of-memory start are classified
by ``server_process`` like vLLM's (SGLang's argparse errors, its "Not enough
memory" and "leave no GPU memory for the KV cache" messages).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping

from inferloom.workloads import server_flags as _sf
from inferloom.workloads.base import AdapterError, Knob
from inferloom.workloads.server_adapter import ServerAdapter
from inferloom.workloads.server_flags import ServerFlags
from inferloom.workloads.server_launch import check_launchable
from inferloom.workloads.server_start import MemoryShareOnce, ServerHandle, StartHooks
from inferloom.workloads.moe_knobs import config_json, drop_moe_only, moe_only_refusal, vendor_narrowed
from inferloom.workloads.sglang_knobs import (ENV_FALLBACK, MOE_RUNNER_KNOB, VERBATIM_CHOICES, recovery_options,
                                             sglang_knobs, to_launch)
from inferloom.workloads.sglang_launch import derive_memory_share, launch_command, memory_args, server_distribution
from inferloom.workloads.sglang_probes import SCORE_APPROXIMATION, greedy_continuations, score_logprobs
from inferloom.workloads.sglang_startup import says, split_text, startup_split

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["SGLangAdapter", "SGLANG_START", "HELP_OPTIONS", "from_spec"]

SGLANG_START = StartHooks("SGLang", startup_split, split_text, says=says)
#: SGLang's launch_server prints one argparse help (no paged groups)
HELP_OPTIONS = ("--help",)


class SGLangAdapter(ServerAdapter):
    name = "sglang"
    label = "SGLang"
    seqs_knob = "max_running_requests"
    to_launch = staticmethod(to_launch)
    start_hooks = SGLANG_START
    probe_greedy = staticmethod(greedy_continuations)
    probe_score = staticmethod(score_logprobs)
    score_note = SCORE_APPROXIMATION
    recovery_table = staticmethod(recovery_options)
    server_profiler = "sglang"  # /start_profile .. /stop_profile (measure/server_profile.py)

    # ------------------------------------------------------- the engine's
    def static_knobs(self) -> list[Knob]:
        return sglang_knobs(self.spec.traffic.concurrency)

    def probe_flags(self) -> ServerFlags:
        s = self.spec.serving
        return _sf.probe_server_flags(s.python, s.module, self._distribution(), {**os.environ, **s.env},
                                      options=HELP_OPTIONS)

    def filter(self, knobs: list[Knob], flags: ServerFlags) -> tuple[list[Knob], dict[str, str], dict[str, str]]:
        kept, dropped, notes = _sf.filter_knobs(knobs, flags, to_launch, ENV_FALLBACK, VERBATIM_CHOICES)
        if self.device != "cpu":  # a dense model drops the experts' kernels (on a CPU: refused at launch)
            why = moe_only_refusal(MOE_RUNNER_KNOB, config_json(self.model_dir()))
            kept, dropped = drop_moe_only(kept, dropped, {MOE_RUNNER_KNOB: why})
            kept, notes = vendor_narrowed(kept, notes, MOE_RUNNER_KNOB, self.spec.serving.python,
                                          {**os.environ, **self.spec.serving.env})
        return kept, dropped, notes

    def make_memory(self) -> MemoryShareOnce:
        def args(spec: Any, cfg: Mapping[str, Any], share: Any, flags: Any, device: str) -> Any:
            return memory_args(spec, cfg, share, flags, device, self.model_dir() if share is not None else None)
        return MemoryShareOnce(self.spec, self.device, self.model_dir, lambda m: self.progress(m),
                               derive_memory_share, args, "SGLang")

    def distribution(self) -> str:
        return server_distribution(self.spec.serving.python)

    def launch_argv(self, cfg: Mapping[str, Any], port: int) -> tuple[list[str], dict[str, str], dict[str, Any]]:
        """The server's ``(argv, env, origin)`` for ``cfg`` on ``port`` (``sglang_launch``) with its memory
        share; ``origin["memory"]`` says where each memory setting came from."""
        flags = self.server_flags().flags
        argv, env, origin = launch_command(self.spec, self.model_dir(), cfg, port, flags, self._trace.longest())
        args, env_m, decided = self._memory.args(cfg, None if flags is None else flags - set(self.rejected_flags))
        return argv + args, {**env, **env_m}, {**origin, "memory": decided}

    def _check(self, cfg: Mapping[str, Any]) -> None:
        """The launch checks on the flags this server gets (the decode graph cap's name is the installed
        server's), so a flag it refused earlier is found under the name it was launched with."""
        flags = self.server_flags().flags
        check_launchable(cfg, self._knobs, self.device, self.rejected_flags, lambda c: to_launch(c, flags))

    def _start(self, cfg: dict[str, Any], reason: str) -> tuple[ServerHandle, dict[str, Any]]:
        dist = self._distribution()
        if not dist.startswith("sglang "):
            raise AdapterError(f"SGLang: serving.python {self.spec.serving.python} has no sglang ({dist}); "
                               "install SGLang in that environment or point serving.python at one that has it",
                               kind="unsupported")
        return super()._start(cfg, reason)


def from_spec(spec: WorkloadSpec) -> SGLangAdapter:
    return SGLangAdapter(spec)
