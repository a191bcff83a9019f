"""The in-process Hugging Face transformers engine: ``generate()`` on one device.

One :class:`TransformersEngine` serves one :class:`~inferloom.spec.WorkloadSpec`.
Each prepared configuration gets its own model instance. A preset's weights
are a pure function of the spec's seed, so every configuration of one dtype
holds the same weights and a bfloat16 build is the float32 build rounded; a
local model directory is loaded from its checkpoint each time.

Knobs (see :meth:`TransformersEngine.knob_space`): ``dtype``,
``attn_implementation``, ``sdpa_backend``, ``cache_implementation``,
``compile_mode``, ``micro_batch``, ``cpu_threads``, ``tf32_matmul``,
``prompt_lookup``, ``decode_loop`` (``generate()`` or
:mod:`inferloom.workloads.static_loop`); the KERNEL phase's ``rmsnorm_impl``,
``attention_kernel`` and ``mlp_kernel`` (applied by :mod:`inferloom.kernels.apply`). A knob that
does not apply to the device, or a value that cannot work there, is refused
by :meth:`prepare` with ``AdapterError(kind='unsupported')`` naming the knob.

Global torch state a configuration changes (thread count, TF32, the SDPA
backend) is applied around each call and restored afterwards, so configurations
never leak into each other.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import itertools
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import torch

from inferloom.kernels.apply import apply_kernels
from inferloom.spec import WorkloadSpec
from inferloom.workloads.base import AdapterError, Knob, RunRecord, config_key, resolve_config
from inferloom.workloads.static_loop import LOOPS, greedy_static

__all__ = ["TransformersEngine", "TransformersHandle"]

_CPU_CUDA = frozenset({"cpu", "cuda"})
_CUDA = frozenset({"cuda"})
_CPU = frozenset({"cpu"})
_SDPA_BACKENDS = ("auto", "math", "efficient", "flash", "cudnn")
_SDPA_CPU_OK = ("auto", "math", "flash")  # torch has a CPU flash-attention kernel
_COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")


@dataclass
class TransformersHandle:
    """One prepared configuration. ``id`` is unique per prepare; ``config_id``
    is the configuration's stable key (what :class:`RunRecord` carries)."""

    id: str
    config: dict[str, Any]
    config_id: str
    model: Any
    device: str
    dtype: torch.dtype
    eager_forward: Any  # the uncompiled forward, used by score()
    prepare_s: float = 0.0
    released: bool = False
    notes: dict[str, Any] = field(default_factory=dict)
    step: Any = None  # decode_loop=static_loop: the decode step's forward (compiled or not)
    caches: dict[tuple[int, int], Any] = field(default_factory=dict)  # static_loop's StaticCache per (batch, length)


def _error_kind(exc: BaseException) -> str:
    oom_types = tuple(
        t
        for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None))
        if isinstance(t, type)
    )
    if oom_types and isinstance(exc, oom_types):
        return "oom"
    text = str(exc).lower()
    if "out of memory" in text:
        return "oom"
    mod = type(exc).__module__ or ""
    if mod.startswith("torch._dynamo") or mod.startswith("torch._inductor") or "backendcompilerfailed" in text:
        return "compile"
    if isinstance(exc, _TokenCountError):
        return "token_count"
    return "error"


class _TokenCountError(RuntimeError):
    """Internal, not an InferloomError: run() records it as a failed run (kind token_count), a quality
    probe's caller as a failed contract; it never reaches the user as an error of its own."""


def _get_tf32() -> bool:
    """CUDA float32-matmul TF32 state. The legacy ``allow_tf32`` flag is used
    (all torch versions have it); torch >= 2.9 may refuse to read it after the
    new ``fp32_precision`` API was used, then that API is read instead."""
    m = torch.backends.cuda.matmul
    try:
        return bool(m.allow_tf32)
    except RuntimeError:
        return getattr(m, "fp32_precision", "ieee") == "tf32"


def _set_tf32(on: bool) -> None:
    m = torch.backends.cuda.matmul
    try:
        m.allow_tf32 = on
    except RuntimeError:  # pragma: no cover - only after the new API was used elsewhere
        m.fp32_precision = "tf32" if on else "ieee"


def _cpu_model_name() -> str:
    from inferloom.provenance import cpu_model

    return cpu_model()


def _flex_available() -> bool:
    if importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
        return False
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        return "flex_attention" in ALL_ATTENTION_FUNCTIONS
    except Exception:  # pragma: no cover
        return False


def _flash_attn_impls() -> list[str]:
    """Hugging Face flash-attention implementations whose package is installed (CUDA only)."""
    out: list[str] = []
    try:
        from transformers.utils import import_utils as iu
    except Exception:  # pragma: no cover
        return out
    for n in (2, 3):
        fn = getattr(iu, f"is_flash_attn_{n}_available", None)
        try:
            if fn is not None and fn():
                out.append(f"flash_attention_{n}")
        except Exception:  # pragma: no cover
            pass
    return out


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
        self._texts: list[str] | None = None
        self._info: dict[str, Any] | None = None
        self._vocab_size: int | None = None

    # ------------------------------------------------------------------ knobs
    def knob_space(self) -> list[Knob]:
        if self._knobs is not None:
            return list(self._knobs)
        t = self.spec.traffic
        attn = ["eager", "sdpa"]
        if _flex_available():
            attn.append("flex_attention")
        attn.extend(_flash_attn_impls())
        ncpu = os.cpu_count() or 1
        self._knobs = [
            Knob(
                "dtype", "choice", self.spec.dtype,
                "weight and activation dtype (float16 is slow on most CPUs)",
                choices=("float32", "bfloat16", "float16"), changes_numerics=True,
            ),
            Knob(
                "attn_implementation", "choice", "sdpa",
                "transformers attention implementation (flash_attention_* only on CUDA)",
                choices=tuple(attn), changes_numerics=True,
            ),
            Knob(
                "sdpa_backend", "choice", "auto",
                "torch SDPA kernel forced with sdpa_kernel() (needs attn_implementation=sdpa); "
                "efficient and cudnn are CUDA-only, flash also has a CPU kernel",
                choices=_SDPA_BACKENDS, changes_numerics=True,
            ),
            Knob(
                "cache_implementation", "choice", "dynamic",
                "KV cache: dynamic (grows) or static (preallocated, fixed shapes; attention then "
                "runs over the padded cache with a mask, a different reduction)",
                choices=("dynamic", "static"), changes_numerics=True,
            ),
            Knob(
                "compile_mode", "choice", "off",
                "torch.compile mode: through transformers' CompileConfig with a static cache, "
                "torch.compile(model.forward, dynamic=True) with a dynamic cache; "
                "reduce-overhead (CUDA graphs) is CUDA-only and needs the static cache; "
                "fused kernels round differently",
                choices=_COMPILE_MODES, changes_numerics=True,
            ),
            Knob(
                "micro_batch", "int", t.concurrency,
                "requests per generate() call; each batch of `concurrency` requests is split into "
                "micro-batches (GEMM shapes change, so CUDA kernels and rounding may too)",
                low=1, high=t.concurrency, changes_numerics=True,
            ),
            Knob(
                "cpu_threads", "int", self._startup_threads,
                "torch intra-op threads during a run (torch.set_num_threads)",
                low=1, high=max(ncpu, self._startup_threads), applies_to=_CPU,
            ),
            Knob(
                "tf32_matmul", "bool", False,
                "allow TF32 tensor cores for float32 matmuls (dtype=float32 only)",
                applies_to=_CUDA, changes_numerics=True,
            ),
            Knob(
                "prompt_lookup", "int", 0,
                "prompt-lookup speculative decoding: draft tokens per step, 0 = off "
                "(transformers assisted generation is batch-size-1 only: needs micro_batch=1 and the "
                "dynamic cache; verifying several tokens per forward changes GEMM shapes and rounding)",
                low=0, high=10, changes_numerics=True,
            ),
            Knob(
                "decode_loop", "choice", "generate",
                "the decoding loop: generate (transformers' generate(): host work and a device sync around "
                "every step) or static_loop (inferloom's greedy loop over a static cache: prefill once, then "
                "the decode step, compiled by compile_mode, with nothing read back until the batch ends; "
                "needs cache_implementation=static); see workloads/static_loop.py",
                choices=LOOPS, changes_numerics=True,
            ),
            Knob(
                "rmsnorm_impl", "choice", "eager",
                "RMSNorm kernel (KERNEL phase): eager (transformers' ops) or torch_fused "
                "(torch.nn.functional.rms_norm, one fused kernel); see kernels/apply.py",
                choices=("eager", "torch_fused"), changes_numerics=True, phase="KERNEL",
            ),
            Knob(
                "attention_kernel", "choice", "sdpa",
                "decode attention over the static cache (KERNEL phase): sdpa (transformers, whole padded "
                "cache), torch_sliced (SDPA over the cache up to the batch's longest valid end), "
                "triton_decode (split-KV kernel reading only each row's valid range, CUDA); "
                "see kernels/attention.py",
                choices=("sdpa", "torch_sliced", "triton_decode"), changes_numerics=True, phase="KERNEL",
            ),
            Knob(
                "mlp_kernel", "choice", "eager",
                "MLP gate/up projection (KERNEL phase): eager (transformers: two GEMMs, SiLU, mul), "
                "torch_gate_up (one GEMM over the concatenated [2I, H] weight, then SiLU·mul), "
                "triton_gate_up_silu (Triton GEMM with a SiLU·mul epilogue, CUDA); the separate gate/up "
                "weights are released; see kernels/gate_up.py",
                choices=("eager", "torch_gate_up", "triton_gate_up_silu"), changes_numerics=True, phase="KERNEL",
            ),
        ]
        return list(self._knobs)

    def _check_applicable(self, cfg: Mapping[str, Any]) -> None:
        dev = self.device
        for knob in self.knob_space():
            if dev not in knob.applies_to and cfg[knob.name] != knob.default:
                raise AdapterError(
                    f"knob '{knob.name}': applies only to {', '.join(sorted(knob.applies_to))}, "
                    f"device is {dev}",
                    kind="unsupported",
                )

        def refuse(name: str, why: str) -> None:
            raise AdapterError(f"knob '{name}': {why}", kind="unsupported")

        if dev == "cpu":
            if cfg["sdpa_backend"] not in _SDPA_CPU_OK:
                refuse("sdpa_backend", f"{cfg['sdpa_backend']} is CUDA-only; device is cpu")
            if cfg["attn_implementation"].startswith("flash_attention"):
                refuse("attn_implementation", f"{cfg['attn_implementation']} is CUDA-only; device is cpu")
            if cfg["compile_mode"] == "reduce-overhead":
                refuse("compile_mode", "reduce-overhead captures CUDA graphs; device is cpu")
        if cfg["attention_kernel"] != "sdpa" and cfg["attn_implementation"] != "sdpa":
            refuse("attention_kernel", f"{cfg['attention_kernel']} replaces the sdpa attention path; "
                   f"attn_implementation is {cfg['attn_implementation']}")
        if cfg["attention_kernel"] == "triton_decode" and dev != "cuda":
            refuse("attention_kernel", f"triton_decode is a CUDA kernel; device is {dev}")
        if cfg["mlp_kernel"] == "triton_gate_up_silu" and dev != "cuda":
            refuse("mlp_kernel", f"triton_gate_up_silu is a CUDA kernel; device is {dev}")
        if cfg["attention_kernel"] == "torch_sliced" and cfg["compile_mode"] == "reduce-overhead":
            refuse("attention_kernel", "torch_sliced slices to a data-dependent length, which CUDA graphs "
                   "(reduce-overhead) cannot capture")
        if cfg["decode_loop"] == "static_loop":
            if cfg["cache_implementation"] != "static":
                refuse("decode_loop", "static_loop decodes over a static KV cache; cache_implementation is "
                       f"{cfg['cache_implementation']}")
            if cfg["prompt_lookup"] > 0:
                refuse("decode_loop", "static_loop decodes one token per step; prompt_lookup needs generate()")
        if cfg["compile_mode"] == "reduce-overhead" and cfg["cache_implementation"] != "static":
            refuse(
                "compile_mode",
                "reduce-overhead (CUDA graphs) needs cache_implementation=static; a dynamic cache "
                "changes shape every decode step",
            )
        if cfg["sdpa_backend"] != "auto" and cfg["attn_implementation"] != "sdpa":
            refuse("sdpa_backend", f"only applies with attn_implementation=sdpa, got {cfg['attn_implementation']}")
        if cfg["tf32_matmul"] and cfg["dtype"] != "float32":
            refuse("tf32_matmul", f"only affects float32 matmuls, dtype is {cfg['dtype']}")
        if cfg["prompt_lookup"] > 0 and cfg["cache_implementation"] != "dynamic":
            refuse(
                "prompt_lookup",
                "needs cache_implementation=dynamic (a static cache is sized for max_new_tokens and "
                "overflows with draft tokens)",
            )
        if cfg["prompt_lookup"] > 0 and cfg["micro_batch"] != 1:
            refuse(
                "prompt_lookup",
                "transformers assisted generation supports batch size 1 only; needs micro_batch=1, "
                f"got micro_batch={cfg['micro_batch']}",
            )

    # -------------------------------------------------------------- tokenizer
    def _model_vocab(self) -> int:
        if self._vocab_size is None:
            from inferloom.models.presets import PRESETS

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
            from inferloom.models.tokenizer import load_tokenizer

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
        from inferloom.models.presets import PRESETS

        vocab = self._model_vocab()
        if self.spec.model in PRESETS:
            return vocab
        return min(vocab, len(self.tokenizer))

    def prompts(self, seed: int, n: int | None = None, length: int | None = None) -> list[list[int]]:
        """The prompts of run ``seed``: ``n`` (default requests_per_run) prompts
        of ``length`` (default input_len) tokens, random ids or JSONL texts."""
        from inferloom.workloads.prompts import load_jsonl_texts, random_prompts, text_prompts

        t = self.spec.traffic
        n = self.spec.requests_per_run if n is None else n
        length = t.input_len if length is None else length
        if t.prompts == "random":
            return random_prompts(seed, n, length, self._random_vocab(), self._special_ids())
        if self._texts is None:
            self._texts = load_jsonl_texts(t.prompts)
        return text_prompts(self._texts, self.tokenizer, length, seed, n)

    # ---------------------------------------------------------------- prepare
    def prepare(self, config: Mapping[str, Any]) -> TransformersHandle:
        from transformers import GenerationConfig

        from inferloom.models.presets import build_model, parse_dtype

        # a bad configuration (unknown knob, bad value, pinned knob changed)
        # raises ConfigError: bad input, not an adapter failure
        cfg = resolve_config(self.knob_space(), config, self.spec.pinned)
        self._check_applicable(cfg)
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
            kind = _error_kind(exc)
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

    # --------------------------------------------------------- per-run state
    @contextlib.contextmanager
    def _state(self, handle: TransformersHandle) -> Iterator[None]:
        cfg = handle.config
        prev_threads = torch.get_num_threads()
        prev_tf32: bool | None = None
        with contextlib.ExitStack() as stack:
            try:
                if self.device == "cpu":
                    torch.set_num_threads(int(cfg["cpu_threads"]))
                else:
                    prev_tf32 = _get_tf32()
                    _set_tf32(bool(cfg["tf32_matmul"]))
                if cfg["sdpa_backend"] != "auto":
                    from torch.nn.attention import SDPBackend, sdpa_kernel

                    backend = {
                        "math": SDPBackend.MATH,
                        "flash": SDPBackend.FLASH_ATTENTION,
                        "efficient": SDPBackend.EFFICIENT_ATTENTION,
                        "cudnn": SDPBackend.CUDNN_ATTENTION,
                    }[cfg["sdpa_backend"]]
                    stack.enter_context(sdpa_kernel(backend))
                stack.enter_context(torch.no_grad())
                yield
            finally:
                if torch.get_num_threads() != prev_threads:
                    torch.set_num_threads(prev_threads)
                if prev_tf32 is not None:
                    _set_tf32(prev_tf32)

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def _batch_tensors(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded input ids and attention mask on the device."""
        width = max(len(p) for p in prompts)
        pad = self._pad_id()
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            if p:
                ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
                mask[i, width - len(p):] = 1
        return ids.to(self.device), mask.to(self.device)

    def _static_loop(self, handle: TransformersHandle, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int,
                     keep_logits: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """decode_loop=static_loop: prefill with the uncompiled forward, decode with the handle's step."""
        return greedy_static(handle.model, handle.eager_forward, handle.step or handle.eager_forward, ids, mask,
                             new_tokens, handle.caches, keep_logits=keep_logits)

    def _generate(
        self, handle: TransformersHandle, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int
    ) -> torch.Tensor:
        """One generate() call; returns the new tokens [b, new_tokens] (still on
        the device). Raises _TokenCountError if the count is not exact."""
        if handle.config["decode_loop"] == "static_loop":
            return self._static_loop(handle, ids, mask, new_tokens)[0]
        kwargs: dict[str, Any] = {
            "max_new_tokens": new_tokens,
            "min_new_tokens": new_tokens,
        }
        if handle.config["prompt_lookup"] > 0:
            kwargs["prompt_lookup_num_tokens"] = int(handle.config["prompt_lookup"])
        out = handle.model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        if not isinstance(out, torch.Tensor):  # a GenerateOutput
            out = out.sequences
        produced = out.shape[1] - ids.shape[1]
        if produced != new_tokens or out.shape[0] != ids.shape[0]:
            raise _TokenCountError(
                f"generate() produced {produced} new tokens for a batch of {ids.shape[0]}, expected {new_tokens}"
            )
        return out[:, ids.shape[1]:]

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
            batches = [prompts[i:i + conc] for i in range(0, n, conc)]
            tensors = [
                [self._batch_tensors(b[j:j + micro]) for j in range(0, len(b), micro)] for b in batches
            ]
            with self._state(handle):
                self._sync()
                t0 = time.perf_counter()
                for batch, parts in zip(batches, tensors):
                    tb = time.perf_counter()
                    produced = 0
                    for ids, mask in parts:
                        new = self._generate(handle, ids, mask, out_len)
                        produced += new.shape[0] * new.shape[1]
                    self._sync()
                    rec.batches.append(
                        {
                            "size": len(batch),
                            "micro_batches": len(parts),
                            "wall_s": time.perf_counter() - tb,
                            "output_tokens": produced,
                        }
                    )
                    rec.output_tokens += produced
                self._sync()
                rec.wall_s = time.perf_counter() - t0
            if rec.output_tokens != rec.expected_output_tokens:
                raise _TokenCountError(
                    f"produced {rec.output_tokens} output tokens, expected {rec.expected_output_tokens}"
                )
            rec.success = True
        except Exception as exc:  # failures are data
            kind = _error_kind(exc)
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
        """Greedy continuations through the configuration's generate() path
        (cache, compile, speculation), batched at its micro_batch."""
        micro = int(handle.config["micro_batch"])
        out: list[list[int]] = []
        with self._state(handle):
            for j in range(0, len(prompts), micro):
                ids, mask = self._batch_tensors(prompts[j:j + micro])
                new = self._generate(handle, ids, mask, max_new_tokens)
                out.extend(new.cpu().tolist())
        return out

    def greedy_logprobs(
        self, handle: TransformersHandle, prompts: list[list[int]], max_new_tokens: int
    ) -> tuple[list[list[int]], torch.Tensor]:
        """Greedy continuations plus the log-probabilities the generate() path
        itself computed at each step (incremental decoding with its cache):
        float32 on CPU, [n, T, V]. Optional probe: the quality contract uses it
        on stock to measure the rounding noise between stock's two paths."""
        micro = int(handle.config["micro_batch"])
        conts: list[list[int]] = []
        chunks: list[torch.Tensor] = []
        with self._state(handle):
            for j in range(0, len(prompts), micro):
                ids, mask = self._batch_tensors(prompts[j:j + micro])
                if handle.config["decode_loop"] == "static_loop":
                    new, rows = self._static_loop(handle, ids, mask, max_new_tokens, keep_logits=True)
                    conts.extend(new.cpu().tolist())
                    chunks.append(torch.log_softmax(torch.stack(rows, dim=1), dim=-1).cpu())
                    continue
                out = handle.model.generate(
                    input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                    min_new_tokens=max_new_tokens, output_logits=True, return_dict_in_generate=True,
                )
                new = out.sequences[:, ids.shape[1]:]
                if new.shape[1] != max_new_tokens or len(out.logits) != max_new_tokens:
                    raise _TokenCountError(
                        f"generate() produced {new.shape[1]} tokens / {len(out.logits)} logit rows, expected {max_new_tokens}"
                    )
                conts.extend(new.cpu().tolist())
                steps = torch.stack([step.float() for step in out.logits], dim=1)
                chunks.append(torch.log_softmax(steps, dim=-1).cpu())
                del out, steps
        return conts, torch.cat(chunks, dim=0)

    def score(
        self, handle: TransformersHandle, prompts: list[list[int]], continuations: list[list[int]]
    ) -> torch.Tensor:
        """Teacher-forced log-probabilities, float32 on CPU, shape [n, T, V]:
        row t is the distribution predicting continuations[i][t]. One forward
        (no cache, uncompiled) over prompt + continuation per micro-batch, under
        the configuration's dtype, attention, SDPA backend and TF32 settings."""
        import inspect

        if len(prompts) != len(continuations):
            raise ValueError("score: prompts and continuations differ in length")
        lens = {len(c) for c in continuations}
        if len(lens) != 1 or 0 in lens:
            raise ValueError("score: all continuations must have the same non-zero length")
        T = lens.pop()
        micro = int(handle.config["micro_batch"])
        fwd = handle.eager_forward
        has_keep = "logits_to_keep" in inspect.signature(fwd).parameters
        chunks: list[torch.Tensor] = []
        with self._state(handle):
            for j in range(0, len(prompts), micro):
                seqs = [list(p) + list(c) for p, c in zip(prompts[j:j + micro], continuations[j:j + micro])]
                ids, mask = self._batch_tensors(seqs)
                pos = (mask.cumsum(-1) - 1).clamp(min=0)
                kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "use_cache": False}
                if has_keep:
                    kwargs["logits_to_keep"] = T + 1
                logits = fwd(**kwargs).logits
                logits = logits[:, -(T + 1):-1, :]
                chunks.append(torch.log_softmax(logits.float(), dim=-1).cpu())
                del logits
        return torch.cat(chunks, dim=0)

    # --------------------------------------------------------------- describe
    def describe(self) -> dict[str, Any]:
        import transformers

        from inferloom.models.presets import model_info

        if self._info is None:
            try:
                self._info = model_info(self.spec.model, dtype=self.spec.dtype)
            except Exception as exc:  # pragma: no cover - describe must not fail
                self._info = {"error": f"{type(exc).__name__}: {exc}"}
        if self.device == "cuda":
            dev_name = torch.cuda.get_device_name(0)
        else:
            dev_name = _cpu_model_name()
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
