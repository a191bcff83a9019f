"""The server-framework base: a WorkloadAdapter for an OpenAI-compatible
inference server run as a subprocess, whatever the engine (vLLM, SGLang).

Everything a server adapter does that is not the engine's own lives here:

* The server runs from its own Python environment (``serving.python``):
  inferloom's environment need not contain the engine.
* ``prepare(config)`` starts a server for that configuration (its own
  process group, a free port) and waits for ``/health``; ``release`` stops the
  group and verifies nothing is left. Each server's log is kept in the log
  directory (the session's ``servers/`` folder) under the candidate's id.
* Reuse (``reuse_servers``, which a session turns on): a released server stays
  alive and the next ``prepare`` of the same configuration gets it back, at
  most two alive (``handle_pool``); one that died is started again. Every
  start is recorded (``take_server_starts``: ``server_start``).
* Memory: each server gets its share of the device's free memory, so both
  servers of a pair fit with equal KV capacity (``memory_share``; read once,
  before this adapter starts anything; the engine's flags give it).
* ``run(handle, seed)`` drives it with the streaming load generator on fresh
  prompts drawn from ``seed`` (``server_run``): warm-up, quiet wait, random ids
  or ``traffic.prompts`` texts (``vllm_texts``) or a trace (``vllm_trace``).
* The knob space is the installed server's: its flags are read once from its
  own ``--help`` (``server_flags``) and a knob whose flag it lacks is dropped,
  with why; a flag the installed server rejects is learned from the launch
  error and never launched again (``rejected_flags``); what each server's log
  says it runs is kept as knob values (``server_runs``: ``server_says``).

A subclass supplies the engine's parts (``vllm_adapter``, ``sglang_adapter``): ``name`` / ``label``,
``static_knobs()``, ``probe_flags()``, ``filter(static, flags)``, ``to_launch`` (knob values -> flags),
``make_memory()``, ``start_hooks``, ``launch_argv(cfg, port)``, ``distribution()``, the quality probes
(``greedy``, ``score``, ``*_batched``, ``score_approximation``), ``recovery_options``, ``seqs_knob``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from inferloom.frameworks import described
from inferloom.workloads.base import AdapterError, Knob, RunRecord, config_key, resolve_config
from inferloom.workloads.engine_ladder import EngineLadder
from inferloom.workloads.handle_pool import HandlePool
from inferloom.workloads.prompts import random_prompts
from inferloom.workloads.server_flags import ServerFlags, without_dropped
from inferloom.workloads.server_launch import ToLaunch, check_launchable, server_model_dir
from inferloom.workloads.server_process import ServerProcess, free_port
from inferloom.workloads.server_run import serving_run
from inferloom.workloads.server_says import knob_values
from inferloom.workloads.server_start import MemoryShareOnce, ServerHandle, StartHooks, start_server
from inferloom.workloads.vllm_texts import ServerTexts
from inferloom.workloads.vllm_trace import ServerTrace

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["ServerAdapter"]


class ServerAdapter:
    name = "server"
    label = "server"  # the engine's name in progress lines
    seqs_knob = ""  # the knob capping the sequences scheduled per step ("" : none)
    server_profiler: str | None = None  # its torch profiler's way (measure/server_profile.PROFILERS), None: none
    aa_quality_sets = ("eval", "heldout")  # AAQuality: outputs vary between identical servers (batch-dependent kernels)
    to_launch: ToLaunch
    start_hooks: StartHooks
    # the engine's quality probes and recovery table (its module functions, as staticmethods): the
    # five probe methods and recovery_options below call them with this adapter's server and settings
    probe_greedy: Callable[..., list[list[int]]]
    probe_score: Callable[..., Any]
    score_note: str  # how the probe's scores approximate the full distribution (score_approximation)
    recovery_table: Callable[..., list[dict[str, Any]]]
    start_budget: Callable[[], float | None] | None = None  # BudgetedStarts: a session trial's seconds left

    def __init__(self, spec: WorkloadSpec, log_dir: str | Path | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        self.spec = spec
        self.device = spec.resolved_device() if spec.device != "auto" else "cpu"
        self.progress: Callable[[str], None] = progress or (lambda _m: None)
        self._told: bool | None = None if progress is None else False  # None: no one to tell yet
        self._log_dir = Path(log_dir) if log_dir else None
        self._handles: dict[str, ServerHandle] = {}
        self.neighbours: Callable[[], list[ServerProcess]] = list  # another engine's live servers (engines)
        self._runs: dict[str, dict[str, dict[str, Any]]] = {}  # config key -> what its server's log said it runs
        self._counter = itertools.count(1)
        self._model_dir: str | None = None
        self._vocab: int | None = None
        self._info: dict[str, Any] | None = None
        self.rejected_flags: dict[str, dict[str, Any]] = {}  # flag -> {knob, value, error}
        self._pool: HandlePool[ServerHandle] = HandlePool(self._stop, lambda h: h.server.alive(), lambda h: h.id)
        self._memory = self.make_memory()
        self._static = self.static_knobs()
        self._space: list[Knob] | None = None  # the static table cut to the server's flags, on first use
        self._flags: ServerFlags | None = None
        self._dropped: dict[str, str] = {}  # knob -> why the installed server can't take it
        self._notes: dict[str, str] = {}
        self._texts = ServerTexts(spec, self.model_dir)
        self._texts.validate()  # a bad text source (no tokenizer, nothing to encode): one line, before anything runs
        self._trace = ServerTrace(spec, self.model_dir, self.vocab_size, lambda: self._texts.tokenizer)
        self._trace.validate()  # traffic.trace read and checked (vllm_trace): a bad one is one line, exit 2
        fw = described(self.name)  # the enablement ladder's rungs 3-5 (engine_ladder): two ENABLEMENT knobs
        self.ladder = EngineLadder(spec, fw.engine_package if fw else None, fw.engine_distributions if fw else (),
                                   self.log_dir, lambda m: self.progress(m))

    # ------------------------------------------------------- the engine's
    def static_knobs(self) -> list[Knob]:
        raise NotImplementedError

    def probe_flags(self) -> ServerFlags:
        raise NotImplementedError

    def filter(self, knobs: list[Knob], flags: ServerFlags) -> tuple[list[Knob], dict[str, str], dict[str, str]]:
        raise NotImplementedError

    def make_memory(self) -> MemoryShareOnce:
        raise NotImplementedError

    def launch_argv(self, cfg: Mapping[str, Any], port: int) -> tuple[list[str], dict[str, str], dict[str, Any]]:
        raise NotImplementedError

    def distribution(self) -> str:
        raise NotImplementedError

    # ------------------------------------------------------------ plumbing
    def set_log_dir(self, path: str | Path, progress: Callable[[str], None] | None = None) -> None:
        """Where server logs go (a session's ``servers/``), and whom to tell about slow start-ups."""
        self._log_dir = Path(path)
        if progress is not None:
            self.progress = progress
            self._told = bool(self._told)
            self._tell_flags()

    def restore_rejected_flags(self, learned: Mapping[str, Mapping[str, Any]]) -> None:
        for flag, info in learned.items():
            self.rejected_flags.setdefault(flag, dict(info))

    def log_dir(self) -> Path:
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix=f"inferloom-{self.name}-logs-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        return self._log_dir

    def model_dir(self) -> str:
        """The local HF directory the server loads; a preset is written once
        (seeded random weights, built tokenizer) under the inferloom cache."""
        if self._model_dir is None:
            self._model_dir = server_model_dir(self.spec, self.progress)
        return self._model_dir

    @property
    def tokenizer(self) -> Any:
        """The model directory's own tokenizer (texts: ``traffic.prompts``, ``quality.prompts_file``)."""
        return self._texts.tokenizer

    def vocab_size(self) -> int:
        if self._vocab is None:
            cfg = json.loads((Path(self.model_dir()) / "config.json").read_text())
            self._vocab = int(cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size"))
        return self._vocab

    # --------------------------------------------------------------- knobs
    def server_flags(self) -> ServerFlags:  # the installed server's flags, read once
        if self._flags is None:
            self._flags = self.probe_flags()
        return self._flags

    @property
    def _knobs(self) -> list[Knob]:
        if self._space is None:
            self._space, self._dropped, self._notes = self.filter(self._static, self.server_flags())
            self._space += self.ladder.knobs()
            self._tell_flags()
        return self._space

    def _tell_flags(self) -> None:
        """One progress line for the probe and one per dropped knob, once, when someone listens."""
        if self._told is not False or self._space is None:
            return
        self._told = True
        f = self.server_flags()
        if f.flags is None:
            self.progress(f"{self.label} server flags unknown ({f.error}); the static knob table stands, and a flag "
                          "the server rejects is learned at launch")
            return
        self.progress(f"{self.label} server flags: {len(f.flags)} from `{f.source}` ({f.version}); "
                      f"{len(self._space)} knobs kept, {len(self._dropped)} dropped")
        for name, why in {**self._dropped, **self._notes}.items():
            self.progress(f"knob {name}: {why}")

    def knob_space(self) -> list[Knob]:
        return list(self._knobs)

    def config_refusal(self, config: Mapping[str, Any]) -> str | None:
        """CrossKnobRules: slower by construction, never measured: the sequences-per-step cap (``seqs_knob``) below
        a closed-loop throughput run's concurrency serializes the requests (H200: vLLM max_num_seqs=1 at c64 -96.6%)."""
        if not self.seqs_knob:
            return None
        seqs, c = int(config.get(self.seqs_knob) or 0), int(self.spec.traffic.concurrency)
        if (0 < seqs < c and self.spec.objective == "output_tokens_per_s"
                and self.spec.serving.arrival == "concurrency" and self.spec.traffic.trace is None):
            return (f"{self.seqs_knob}={seqs} is below traffic.concurrency={c}: at most {seqs} of the {c} requests in "
                    "flight are scheduled per step, so throughput can only drop; not measured")
        return None

    def _without_dropped(self, values: Mapping[str, Any], what: str) -> dict[str, Any]:
        return without_dropped(values, self._static, self._dropped, what)

    def _check(self, cfg: Mapping[str, Any]) -> None:
        check_launchable(cfg, self._knobs, self.device, self.rejected_flags, type(self).to_launch)

    def memory_share(self) -> Any:
        """Each server's share of the device's memory (``memory_share``), read
        once, before this adapter starts a server; None when not derived."""
        return self._memory.get()

    # ------------------------------------------------------------- prepare
    def reuse_servers(self, on: bool = True, max_live: int = 2) -> None:
        """From now on a released server stays alive for the next ``prepare`` of
        its configuration (at most ``max_live`` alive); off: stopped at release."""
        self._pool.keep, self._pool.max_live = on, max(1, max_live)

    def expect_servers(self, configs: Sequence[Mapping[str, Any]]) -> None:
        """The configurations the coming comparison needs: their servers are stopped last."""
        keys = []
        for c in configs:
            try:
                keys.append(self.pool_key(self._resolved(c)))
            except (AdapterError, ValueError):
                continue  # prepare says why
        self._pool.want(keys)

    def take_server_starts(self) -> list[dict[str, Any]]:
        """The server starts since the last call (for the session's ledger)."""
        return self._pool.take_starts()

    def stop_idle(self) -> list[str]:
        """Stop every server not lent out (another adapter needs the device, or the session ends)."""
        return self._pool.stop_idle()

    def _resolved(self, config: Mapping[str, Any]) -> dict[str, Any]:
        return resolve_config(self._knobs, self._without_dropped(config, "candidate"),
                              self._without_dropped(self.spec.pinned, "pinned"))

    def prepare(self, config: Mapping[str, Any]) -> ServerHandle:
        cfg = self._resolved(config)
        self._check(cfg)
        return self._pool.acquire(self.pool_key(cfg), lambda reason: self._start(cfg, reason))

    def _start(self, cfg: dict[str, Any], reason: str) -> tuple[ServerHandle, dict[str, Any]]:
        cid = config_key(cfg)
        hid = f"{next(self._counter):02d}-{hashlib.sha1(cid.encode()).hexdigest()[:8]}"
        port = free_port()
        h, record = start_server(hid, cfg, cid, self.ladder.launch(cfg, *self.launch_argv(cfg, port), not self.launches_overlays), port,
                                 self.log_dir() / f"{hid}.log",
                                 self.spec.serving.startup_timeout_s, self.progress, self.rejected_flags, reason,
                                 self._memory.get(), hooks=self.start_hooks, budget=self.start_budget)
        self._handles[hid] = h
        record["server_runs"] = self._runs[cid] = knob_values(record.pop("says", None) or {}, self._knobs)
        self.after_start(h, record)
        return h, record

    def server_runs(self, config: Mapping[str, Any]) -> dict[str, dict[str, Any]] | None:
        """ServerRuns: what the log of the server started for ``config`` said it runs (``server_says``)."""
        try:
            return self._runs.get(config_key(self._resolved(config)))
        except (AdapterError, ValueError):
            return None

    launches_overlays = False  # the engine's launch_argv puts ladder_overlays(cfg) on PYTHONPATH itself (vLLM's)

    def ladder_overlays(self, cfg: Mapping[str, Any]) -> tuple[Any, ...]:
        """The source overlay of ``cfg``'s enablement rung (rungs 3 and 5), for an engine that launches overlays."""
        return self.ladder.overlays(cfg)

    def source_rungs(self, rung: int) -> tuple[list[dict[str, Any]], str]:
        """SourceRungs: rung ``rung``'s candidates and, when there are none, why."""
        cands = self.ladder.candidates(rung)
        return cands, "" if cands else self.ladder.why_none(rung)

    def rung_stack(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """SourceRungs: the overlay and the environment a server of ``config`` starts with."""
        return self.ladder.stack(config)

    def pool_key(self, cfg: Mapping[str, Any]) -> str:
        """The identity under which a started server is reused: its configuration (an engine adds what else
        its server starts with, e.g. vLLM's engine overlays)."""
        return config_key(cfg)

    def after_start(self, handle: ServerHandle, record: dict[str, Any]) -> None:
        """A healthy server's check before it is lent (stop it and raise AdapterError to refuse it)."""

    # ----------------------------------------------------------------- run
    def random_prompts(self, seed: int, n: int | None = None, length: int | None = None) -> list[list[int]]:
        """Random token ids (``length`` each), whatever ``traffic.prompts`` says: warm-ups, the shared prefix."""
        n = self.spec.requests_per_run if n is None else n
        return random_prompts(seed, n, self.spec.traffic.input_len if length is None else length,
                              self.vocab_size(), {0, 1, 2})

    def prompts(self, seed: int, n: int | None = None, length: int | None = None) -> list[list[int]]:
        """Run ``seed``'s prompts: random ids of ``length`` tokens, or ``traffic.prompts`` texts of at most
        ``length`` tokens (``vllm_texts``)."""
        if self._texts.source == "random":
            return self.random_prompts(seed, n, length)
        n = self.spec.requests_per_run if n is None else n
        return self._texts.draw(seed, n, self.spec.traffic.input_len if length is None else length)

    def run_prompts(self, seed: int) -> tuple[list[list[int]], dict[str, Any]]:
        """Fresh prompts per run; in ``shared`` mode every prompt starts with the
        same declared prefix (random ids from the spec's seed), the rest fresh (texts: the text's first
        ``input_len - shared_prefix_len`` tokens)."""
        s, t = self.spec.serving, self.spec.traffic
        ps = self.prompts(seed)
        k = min(s.shared_prefix_len, t.input_len) if s.prefix == "shared" else 0
        if k:
            prefix = self.random_prompts(self.spec.seed + 424_242, 1, k)[0]
            ps = [prefix + (p[k:] if self._texts.source == "random" else p[:t.input_len - k]) for p in ps]
        return ps, {"prompt_mode": s.prefix, "shared_prefix_len": k, "fresh_prompts_per_run": True,
                    "seed": seed, **self._texts.state(seed, len(ps))}

    def _others(self, handle: ServerHandle) -> list[ServerProcess]:
        return [h.server for h in self._handles.values() if h is not handle] + self.neighbours()

    def live_servers(self) -> list[ServerProcess]:  # what another engine's runs wait to be quiet (engines)
        return [h.server for h in self._handles.values() if h.server.alive()]

    def run(self, handle: ServerHandle, seed: int) -> RunRecord:
        return serving_run(self.spec, handle, seed, draw_prompts=self.random_prompts, run_prompts=self.run_prompts,
                           others=lambda: self._others(handle), model_id=self.model_dir,
                           trace_plan=self._trace.plan if self._trace.enabled else None)

    # ------------------------------------------------------------ describe
    def _distribution(self) -> str:
        if self._info is None:
            self._info = {"server_distribution": self.distribution()}
        return str(self._info["server_distribution"])

    def describe(self) -> dict[str, Any]:
        """Provenance, with ``server_flags``: the flags the installed server
        lists, where they were read, and each knob dropped or adjusted for it."""
        self._distribution()
        self._knobs  # noqa: B018 - reads the server's flags once
        flags = {**self.server_flags().to_dict(), "dropped_knobs": dict(self._dropped), "knob_notes": dict(self._notes)}
        return {"framework": self.name, "adapter": self.name, "server_python": self.spec.serving.python,
                "server_module": self.spec.serving.module, **(self._info or {}), "model": self.spec.model,
                "device": self.device, "traffic_prompts": self._texts.source,
                "python_version": platform.python_version(), "cpu_count": os.cpu_count(),
                "dtype": self.spec.dtype, "server_flags": flags, "memory_share": self._memory.record()}

    # ------------------------------------------------------------- quality
    def greedy(self, handle: ServerHandle, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Greedy continuations through the server (its batching, cache, speculation), one request per
        prompt, ``quality.concurrency`` in flight (1: each prompt alone, the same batches on every server)."""
        return type(self).probe_greedy(handle.server.base_url, handle.id, prompts, max_new_tokens,
                                       self.spec.serving.request_timeout_s, self.spec.quality.concurrency)

    @property
    def score_approximation(self) -> str:
        return self.score_note

    def score(self, handle: ServerHandle, prompts: list[list[int]], continuations: list[list[int]]) -> Any:
        return type(self).probe_score(handle.server.base_url, handle.id, prompts, continuations, self.vocab_size(),
                                      self.spec.serving.request_timeout_s, self.spec.quality.concurrency)

    def greedy_batched(self, handle: ServerHandle, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """All prompts in one request: the batched path (``BatchedProbes``)."""
        return type(self).probe_greedy(handle.server.base_url, handle.id, prompts, max_new_tokens,
                                       self.spec.serving.request_timeout_s, None)

    def score_batched(self, handle: ServerHandle, prompts: list[list[int]], continuations: list[list[int]]) -> Any:
        return type(self).probe_score(handle.server.base_url, handle.id, prompts, continuations, self.vocab_size(),
                                      self.spec.serving.request_timeout_s, None)

    def recovery_options(self, kind: str, stock: dict[str, Any]) -> list[dict[str, Any]]:
        """Flag or environment changes that address a failure kind, least invasive first."""
        return type(self).recovery_table(kind, stock, self.device, self._knobs, self.rejected_flags)

    # ------------------------------------------------------------- release
    def release(self, handle: ServerHandle) -> None:
        """Back to the pool (alive, for the next ``prepare`` of its configuration)
        while reuse is on; else, or when it died, its process group is stopped."""
        if not handle.released:
            self._pool.release(handle)

    def _stop(self, handle: ServerHandle) -> None:
        if handle.released:
            return
        handle.released = True
        self._handles.pop(handle.id, None)
        handle.notes["stop"] = handle.server.stop()

    def close(self) -> None:
        self._pool.close()
        for h in list(self._handles.values()):
            self._stop(h)
