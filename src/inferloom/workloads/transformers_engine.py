"""The in-process Hugging Face transformers engine: ``generate()`` on one device.

One :class:`TransformersEngine` serves one :class:`~inferloom.spec.WorkloadSpec`.
Each prepared configuration gets its own model instance. A preset's weights
are a pure function of the spec's seed, so every configuration of one dtype
holds the same weights and a bfloat16 build is the float32 build rounded; a
local model directory is loaded from its checkpoint each time.

Knobs: :mod:`inferloom.workloads.transformers_knobs` (the table and the rules
by which :meth:`TransformersEngine.prepare` refuses a knob that does not apply
to the device, or a value that cannot work there, with
``AdapterError(kind='unsupported')`` naming the knob); the KERNEL phase's
knobs are applied by :mod:`inferloom.workloads.engine_kernels`. The
generation loop and the per-call torch state:
:mod:`inferloom.workloads.transformers_generation`; the quality probes
(greedy, greedy_logprobs, score): :mod:`inferloom.workloads.transformers_quality`.
"""

from __future__ import annotations

import gc
import itertools
import os
import platform
import time
from typing import Any, Mapping

import torch

from inferloom.models.presets import PRESETS, build_model, model_info, parse_dtype
from inferloom.models.tokenizer import load_tokenizer
from inferloom.provenance import cpu_model
from inferloom.spec import WorkloadSpec
from inferloom.workloads import transformers_quality as quality
from inferloom.workloads.base import AdapterError, Knob, RunRecord, config_key, resolve_config
from inferloom.workloads.engine_kernels import apply_kernels
from inferloom.workloads.engine_written import knob as written_knob
from inferloom.workloads.prompts import load_prompt_file, random_prompts, render_chats, text_prompts, window_prompts
from inferloom.workloads.transformers_generation import (
    TokenCountError,
    TransformersHandle,
    batch_tensors,
    error_kind,
    generate_tokens,
    run_state,
    sync,
)
from inferloom.workloads.transformers_knobs import check_applicable, transformers_knobs

__all__ = ["TransformersEngine"]


class TransformersEngine:
    """WorkloadAdapter for ``model.generate()`` in this process."""

    name = "transformers"

    def __init__(self, spec: WorkloadSpec) -> None:
        self.spec = spec
        self.device = spec.resolved_device()
        if self.device == "cuda" and not torch.cuda.is_available():
            raise AdapterError("spec device 'cuda': no CUDA device is available", kind="unsupported")
        self._startup_threads = torch.get_num_threads()
        self._knobs: list[Knob] | None = None
        self._handles: dict[str, TransformersHandle] = {}
        self._counter = itertools.count(1)
        self._tokenizer: Any = None
        self._texts: list[Any] | None = None  # the texts, or the chats (traffic.chat_template)
        self._chat_pool: list[list[int]] | None = None  # the chats rendered, once
        self._info: dict[str, Any] | None = None
        self._vocab_size: int | None = None

    # ------------------------------------------------------------------ knobs
    def knob_space(self) -> list[Knob]:
        if self._knobs is None:
            self._knobs = transformers_knobs(self.spec, self._startup_threads)
        llm = self.spec.agents.llm
        # the LLM kernel author's switch, its domain the kernels whose gates passed so far (kernels/written.py)
        return list(self._knobs) + ([written_knob()] if llm is not None and "kernel_author" in llm.roles else [])

    # -------------------------------------------------------------- tokenizer
    def _model_vocab(self) -> int:
        if self._vocab_size is None:
            if self.spec.model in PRESETS:
                self._vocab_size = int(PRESETS[self.spec.model]["vocab_size"])
            else:
                from transformers import AutoConfig

                cfg = AutoConfig.from_pretrained(self.spec.model, local_files_only=True)
                text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
                self._vocab_size = int(text_cfg.vocab_size)
        return self._vocab_size

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.spec.model, self._model_vocab())
        return self._tokenizer

    def _special_ids(self) -> set[int]:
        tok = self.tokenizer
        ids = {int(i) for i in (getattr(tok, "all_special_ids", None) or [])}
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "unk_token_id"):
            v = getattr(tok, name, None)
            if isinstance(v, int):
                ids.add(v)
        return ids

    def _pad_id(self) -> int:
        pad = getattr(self.tokenizer, "pad_token_id", None)
        return int(pad) if pad is not None else 0

    def _random_vocab(self) -> int:
        """Random prompts draw from the model's vocabulary; for a local model
        only ids its own tokenizer knows (rows beyond are often untrained padding)."""
        vocab = self._model_vocab()
        if self.spec.model in PRESETS:
            return vocab
        return min(vocab, len(self.tokenizer))

    def prompts(self, seed: int, n: int | None = None, length: int | None = None) -> list[list[int]]:
        """The prompts of run ``seed``: ``n`` (default requests_per_run) prompts
        of ``length`` (default input_len) tokens, random ids or JSONL texts; chats (``traffic.chat_template``)
        rendered once by the chat template, none longer than input_len, and cut to a shorter ``length`` (a
        quality probe's) by keeping their last tokens (``inferloom.workloads.prompts``)."""
        t = self.spec.traffic
        n = self.spec.requests_per_run if n is None else n
        length = t.input_len if length is None else length
        if t.prompts == "random":
            return random_prompts(seed, n, length, self._random_vocab(), self._special_ids())
        if self._texts is None:
            self._texts = load_prompt_file(t.prompts, t.chat_template, "traffic.chat_template")
        if t.chat_template:
            if self._chat_pool is None:
                self._chat_pool = render_chats(self._texts, self.tokenizer, f"traffic.prompts '{t.prompts}'",
                                               max_len=t.input_len)
            return window_prompts(self._chat_pool, length, seed, n, keep="tail")
        return text_prompts(self._texts, self.tokenizer, length, seed, n)

    def config_refusal(self, config: Mapping[str, Any]) -> str | None:
        """Why ``prepare`` would refuse ``config`` by the knobs' cross rules, else None (CrossKnobRules)."""
        try:
            check_applicable(self.knob_space(), {**{k.name: k.default for k in self.knob_space()}, **config},
                             self.device)
        except AdapterError as exc:
            return str(exc)
        return None

    # ---------------------------------------------------------------- prepare
    def prepare(self, config: Mapping[str, Any]) -> TransformersHandle:
        from transformers import GenerationConfig

        # a bad configuration (unknown knob, bad value, pinned knob changed)
        # raises ConfigError: bad input, not an adapter failure
        cfg = resolve_config(self.knob_space(), config, self.spec.pinned)
        check_applicable(self.knob_space(), cfg, self.device)
        if self.spec.traffic.prompts != "random":
            try:  # surface a bad prompts file before any timing
                self.prompts(self.spec.seed, n=1)
            except ValueError as exc:
                raise AdapterError(str(exc), kind="prompts") from None

        t0 = time.perf_counter()
        dtype = parse_dtype(cfg["dtype"])
        try:
            model = build_model(self.spec.model, dtype, self.device, self.spec.seed, cfg["attn_implementation"])
        except Exception as exc:
            gc.collect()
            if self.device == "cuda":
                torch.cuda.empty_cache()
            kind = error_kind(exc)
            raise AdapterError(
                f"building model for {config_key(cfg)} failed: {type(exc).__name__}: {exc}",
                kind="oom" if kind == "oom" else ("unsupported" if isinstance(exc, (ValueError, ImportError)) else kind),
            ) from exc

        try:
            kernel_notes = apply_kernels(model, cfg)
        except Exception as exc:
            raise AdapterError(f"applying kernels for {config_key(cfg)} failed: {type(exc).__name__}: {exc}",
                               kind="unsupported") from exc
        eager_forward = model.forward
        gen = GenerationConfig(
            do_sample=False,
            num_beams=1,
            bos_token_id=getattr(self.tokenizer, "bos_token_id", None),
            eos_token_id=None,  # EOS disabled: every request produces exactly output_len tokens
            pad_token_id=self._pad_id(),
            use_cache=True,
        )
        if cfg["cache_implementation"] == "static":
            gen.cache_implementation = "static"
        mode = cfg["compile_mode"]
        gen.disable_compile = True  # never let transformers auto-compile behind our back
        notes: dict[str, Any] = dict(kernel_notes)
        step = None
        if cfg["decode_loop"] == "static_loop":
            notes["decode_loop"] = "static_loop: prefill uncompiled, then one decode step per token, no host sync"
            if mode != "off":
                step = torch.compile(model.forward, mode=mode, fullgraph=False, dynamic=False)
                notes["compile"] = f"torch.compile(model.forward, mode={mode}) of the decode step (static_loop)"
        elif mode != "off":
            if cfg["cache_implementation"] == "static":
                from transformers import CompileConfig

                cc = CompileConfig(mode=mode, fullgraph=False)  # explicit: defaults differ across versions
                cc._compile_all_devices = True  # also compile on CPU
                gen.compile_config = cc
                gen.disable_compile = False
                notes["compile"] = "transformers CompileConfig (decode steps, static cache)"
            else:
                model.forward = torch.compile(model.forward, mode=mode, dynamic=True)
                notes["compile"] = "torch.compile(model.forward, dynamic=True)"
        model.generation_config = gen

        handle = TransformersHandle(
            id=f"{self.name}-{next(self._counter)}",
            config=cfg,
            config_id=config_key(cfg),
            model=model,
            device=self.device,
            dtype=dtype,
            eager_forward=eager_forward,
            prepare_s=time.perf_counter() - t0,
            notes=notes,
            step=step,
        )
        self._handles[handle.id] = handle
        return handle

    # ---------------------------------------------------------------- batches
    def _batch_tensors(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded input ids and attention mask on the device."""
        return batch_tensors(prompts, self._pad_id(), self.device)

    # -------------------------------------------------------------------- run
    def run(self, handle: TransformersHandle, seed: int) -> RunRecord:
        t = self.spec.traffic
        n, out_len, conc = self.spec.requests_per_run, t.output_len, t.concurrency
        micro = int(handle.config["micro_batch"])
        rec = RunRecord(
            config_id=handle.config_id,
            seed=seed,
            success=False,
            started_at=time.time(),
            num_requests=n,
            expected_output_tokens=n * out_len,
            extra={"handle_id": handle.id, "micro_batch": micro, "concurrency": conc},
        )
        if handle.released:
            rec.error = "error: handle was released"
            return rec
        try:
            prompts = self.prompts(seed)
            rec.input_tokens = sum(len(p) for p in prompts)
            rec.extra["input_lens"] = [len(p) for p in prompts]  # per request: texts and chats vary
            batches = [prompts[i:i + conc] for i in range(0, n, conc)]
            tensors = [
                [self._batch_tensors(b[j:j + micro]) for j in range(0, len(b), micro)] for b in batches
            ]
            with run_state(handle):
                sync(self.device)
                t0 = time.perf_counter()
                for batch, parts in zip(batches, tensors):
                    tb = time.perf_counter()
                    produced = 0
                    for ids, mask in parts:
                        new = generate_tokens(handle, ids, mask, out_len)
                        produced += new.shape[0] * new.shape[1]
                    sync(self.device)
                    rec.batches.append(
                        {
                            "size": len(batch),
                            "micro_batches": len(parts),
                            "wall_s": time.perf_counter() - tb,
                            "output_tokens": produced,
                        }
                    )
                    rec.output_tokens += produced
                sync(self.device)
                rec.wall_s = time.perf_counter() - t0
            if rec.output_tokens != rec.expected_output_tokens:
                raise TokenCountError(
                    f"produced {rec.output_tokens} output tokens, expected {rec.expected_output_tokens}"
                )
            rec.success = True
        except Exception as exc:  # failures are data
            kind = error_kind(exc)
            rec.success = False
            rec.error = f"{kind}: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:2000]
            rec.extra["kind"] = kind
            if kind == "oom":
                gc.collect()
                if self.device == "cuda":
                    torch.cuda.empty_cache()
        return rec

    # ---------------------------------------------------------------- quality
    def greedy(
        self, handle: TransformersHandle, prompts: list[list[int]], max_new_tokens: int
    ) -> list[list[int]]:
        """See :func:`inferloom.workloads.transformers_quality.greedy`."""
        return quality.greedy(handle, prompts, max_new_tokens, self._pad_id())

    def greedy_logprobs(
        self, handle: TransformersHandle, prompts: list[list[int]], max_new_tokens: int
    ) -> tuple[list[list[int]], torch.Tensor]:
        """See :func:`inferloom.workloads.transformers_quality.greedy_logprobs`."""
        return quality.greedy_logprobs(handle, prompts, max_new_tokens, self._pad_id())

    def score(
        self, handle: TransformersHandle, prompts: list[list[int]], continuations: list[list[int]]
    ) -> torch.Tensor:
        """See :func:`inferloom.workloads.transformers_quality.score`."""
        return quality.score(handle, prompts, continuations, self._pad_id())

    # --------------------------------------------------------------- describe
    def describe(self) -> dict[str, Any]:
        import transformers

        if self._info is None:
            try:
                self._info = model_info(self.spec.model, dtype=self.spec.dtype)
            except Exception as exc:  # pragma: no cover - describe must not fail
                self._info = {"error": f"{type(exc).__name__}: {exc}"}
        if self.device == "cuda":
            dev_name = torch.cuda.get_device_name(0)
        else:
            dev_name = cpu_model()
        return {
            "framework": "transformers",
            "adapter": self.name,
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "cuda_version": torch.version.cuda,
            "python_version": platform.python_version(),
            "device": self.device,
            "device_name": dev_name,
            "device_count": torch.cuda.device_count() if self.device == "cuda" else 1,
            "cpu_count": os.cpu_count(),
            "startup_threads": self._startup_threads,
            "model": self.spec.model,
            "model_info": self._info,
            "dtype": self.spec.dtype,
        }

    # ---------------------------------------------------------------- release
    def release(self, handle: TransformersHandle) -> None:
        if handle.released:
            return
        handle.released = True
        self._handles.pop(handle.id, None)
        handle.model = None
        handle.eager_forward = None
        handle.step = None
        handle.caches = {}
        if handle.config.get("compile_mode", "off") != "off" and not any(
            h.config.get("compile_mode", "off") != "off" for h in self._handles.values()
        ):
            # Compiled graphs may keep the model's tensors alive; drop them, but
            # only when no live configuration is compiled (a reset would make it
            # recompile inside its next timed run).
            try:
                torch._dynamo.reset()
            except Exception:  # pragma: no cover
                pass
        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()

    def close(self) -> None:
        for h in list(self._handles.values()):
            self.release(h)
