"""The KERNEL phase's backend for vLLM servers: ``register_oot`` replacements delivered through the plugin
overlay (``vllm_plugins``), switched on end to end by the knob ``kernel_plugin`` (``vllm_kernel_overlays``).

The framework descriptor names it (``Framework.kernel_backend``); ``spec.kernels.backend: plugin`` runs it.

* Targets: the server's own profile (PRELUDE takes one through vLLM's profiler when this backend will run:
  ``workloads/vllm_profile.py``, ``phases/server_profile.py``), its categories' shares picked like any
  profile's, so the Amdahl bound is claimed from a measured share. Without one (the profile skipped or
  failed: the ledger's ``profile`` entry says why), :data:`FIXED_ORDER` (the categories this backend has
  replacements for, in that order; the ``kernel_targets`` entry says so) with no time share: no Amdahl
  bound is claimed for them.
* Candidates (:data:`~inferloom.workloads.vllm_kernel_overlays.REPLACEMENTS`, those for the device):
  RMSNorm (target ``normalization``: ``torch_rmsnorm``; on CUDA also the catalog's ``triton_rmsnorm``) and
  SiluAndMul (target ``elementwise``: ``torch_silu_mul``; on CUDA also ``triton_silu_mul``). One plugin
  carries one replacement per op: :meth:`VLLMPluginBackend.merge` adds a candidate's replacement to the
  plugin the stack already loads (a RMSNorm kept, then a SiluAndMul measured with it:
  ``torch_rmsnorm+torch_silu_mul``); an op the stack's plugin already replaces is not proposed again.
* ``guarded``: the KERNEL phase runs the reward-hacking guards (``kernels/guards.py``) on these candidates
  before the correctness gate: a plugin runs inside the server, where only the end-to-end quality contract
  watches it, and the guards cost a few small tensors.
* The gates run the replacement's own source (the bytes the overlay carries) in this process on small
  tensors, before any server starts: the module is executed, its ``forward`` called with a stand-in layer
  (RMSNorm: ``weight``, ``variance_epsilon``, a residual as the decoder's fused add; ``stock_forward`` =
  vLLM's composition) at the decode and a prefill shape; the baseline the microbenchmark races is vLLM
  0.32's native op for op (``fused_add_rms_norm``, which writes the normalised output and the residual;
  ``SiluAndMul.forward_native``), the reference float64. The microbenchmark times the replacement's
  ``forward`` as the server calls it (``KernelCandidate.timed``: its result returned, as stock's is), not the
  gates' copy of it into ``out`` (on the H100 that copy, a second kernel, made every replacement look ~2x
  slower than inductor's one kernel: docs/benchmarks.md section 27).
* **As the server runs them** (:func:`server_compiles`): a vLLM server compiles its model with
  torch.compile (inductor) unless ``--enforce-eager`` or ``--optimization-level 0``, on a CPU as on a GPU;
  inductor fuses stock's native composition into one kernel and traces the replacement into the same graph.
  Then the gates run both compiled (``torch.compile(fullgraph=True)``: the baseline, and the replacement's
  ``forward`` with its stand-in layer), so the microbenchmark races what the server would run, not an eager
  op the server never runs, and a replacement torch.compile can't trace fails here (``kernel_crashed``)
  rather than at its server's start. An eager stack gets the eager gates. The candidate's ``op`` and
  ``notes`` say which. (An eager CUDA server enables vLLM's custom ops, its ``_C`` kernels, which the inferloom
  process can't import: there the eager gate races vLLM's native composition, which flatters a replacement; the
  end-to-end pairs judge it. The GPU examples compile.)
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from inferloom.kernels.base import KernelCandidate, Target, model_config
from inferloom.models.presets import parse_dtype
from inferloom.kernels.written import KNOB as WRITTEN_KNOB
from inferloom.workloads.vllm_kernel_overlays import PLUGIN_KNOB, REPLACEMENTS, combine
from inferloom.workloads.vllm_written import ops as written_ops
from inferloom.workloads.vllm_written import replacement_of as written_replacement

__all__ = ["VLLMPluginBackend", "FIXED_ORDER", "vllm_rmsnorm", "rmsnorm_reference", "rmsnorm_inputs",
           "vllm_silu_mul", "silu_mul_reference", "silu_mul_inputs", "replacement_forward", "server_compiles",
           "server_candidate", "written_as_served", "PREFILL_TOKENS_CHECKED", "TOLERANCES"]

#: the categories the backend tries, in this order, when the session has no profile of the server
FIXED_ORDER: tuple[str, ...] = ("normalization", "elementwise")
#: the correctness gate's tolerance by the checked dtype (two roundings to the dtype dominate in half precision)
TOLERANCES: dict[str, dict[str, float]] = {"float32": {"rel_l2": 1e-5, "max_rel": 1e-5},
                                           "float16": {"rel_l2": 2e-3, "max_rel": 4e-3},
                                           "bfloat16": {"rel_l2": 1e-2, "max_rel": 2e-2}}
PREFILL_TOKENS_CHECKED = 256
_EPS = 1e-6


def rmsnorm_inputs(shape: Mapping[str, int], dtype: str, device: str, seed: int) -> tuple[dict[str, Any], Any]:
    """``hidden_states`` and ``residual`` ``[tokens, hidden]`` ~ N(0, 1), ``weight`` ~ 1 + N(0, 0.1)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(int(seed))
    dt = parse_dtype(dtype)
    t, h = int(shape["tokens"]), int(shape["hidden"])
    x = torch.randn(t, h, generator=g).to(device=device, dtype=dt)
    r = torch.randn(t, h, generator=g).to(device=device, dtype=dt)
    w = (1.0 + 0.1 * torch.randn(h, generator=g)).to(device=device, dtype=dt)
    return {"hidden_states": x, "residual": r, "weight": w, "eps": _EPS}, torch.empty_like(x)


def vllm_rmsnorm(hidden_states: Any, residual: Any, weight: Any, eps: float) -> Any:
    """vLLM 0.32's ``ir.ops.fused_add_rms_norm`` (the stock op on CPU), op for op: the normalised output and the
    residual handed on (the sum in the activations' dtype), both of which the op writes."""
    import torch

    dt = hidden_states.dtype
    x = hidden_states.to(torch.float32) + residual.to(torch.float32)
    summed = x.to(dt)
    x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x.to(weight.dtype) * weight).to(dt), summed


def rmsnorm_reference(hidden_states: Any, residual: Any, weight: Any, eps: float) -> Any:
    """The truth in float64."""
    import torch

    x = hidden_states.to(torch.float64) + residual.to(torch.float64)
    return weight.to(torch.float64) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def silu_mul_inputs(shape: Mapping[str, int], dtype: str, device: str, seed: int) -> tuple[dict[str, Any], Any]:
    """``x`` ``[tokens, 2 * intermediate]`` ~ 2 N(0, 1) (the gate/up GEMM's output), ``out`` ``[tokens, intermediate]``."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(int(seed))
    t, i = int(shape["tokens"]), int(shape["intermediate"])
    x = (2.0 * torch.randn(t, 2 * i, generator=g)).to(device=device, dtype=parse_dtype(dtype))
    return {"x": x}, torch.empty(t, i, dtype=x.dtype, device=device)


def vllm_silu_mul(x: Any) -> Any:
    """vLLM 0.32's ``SiluAndMul.forward_native`` (the stock op on x86 CPUs)."""
    import torch.nn.functional as F

    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def silu_mul_reference(x: Any) -> Any:
    """The truth in float64."""
    import torch
    import torch.nn.functional as F

    y = x.to(torch.float64)
    d = y.shape[-1] // 2
    return F.silu(y[..., :d]) * y[..., d:]


_SOURCES: list[Path] = []  # this process's private folder of gate modules (made once, removed at exit)


def _source_dir() -> Path:
    if not _SOURCES:
        d = Path(tempfile.mkdtemp(prefix="inferloom-gate-"))  # mode 0700: no other user can plant a module
        atexit.register(shutil.rmtree, d, True)
        _SOURCES.append(d)
    return _SOURCES[0]


def replacement_forward(source: str, name: str) -> Callable[..., Any]:
    """The ``forward`` of a replacement's source, imported from a file of its own as the plugin's module is in
    the server (``triton.jit`` and torch.compile read a function's source and module as they would there)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    modname = f"inferloom_gate_{name}_{digest}"
    if modname not in sys.modules:
        path = _source_dir() / f"{modname}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(modname, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)  # inferloom's own source, or a written kernel the gates are about to judge
        sys.modules[modname] = mod  # torch.compile resolves the forward's globals through its module
    return sys.modules[modname].forward


def server_compiles(workload: Mapping[str, Any]) -> bool:
    """Whether the workload's vLLM server compiles its model (torch.compile, inductor): not when the stack
    sets ``enforce_eager`` or ``optimization_level`` 0, or the spec's ``serving.extra_args`` pass
    ``--enforce-eager`` / ``-O0`` / ``--optimization-level 0``."""
    stack = workload.get("stack") or {}
    args = [str(a) for a in workload.get("server_args") or ()]
    level = next((b for a, b in zip(args, args[1:]) if a in ("--optimization-level", "-O")), None)
    return not (stack.get("enforce_eager") is True or str(stack.get("optimization_level", "default")) == "0"
                or "--enforce-eager" in args or "-O0" in args or "--optimization-level=0" in args or level == "0")


def _compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` under torch.compile as vLLM compiles its model (inductor, the whole function as one graph)."""
    import torch

    return torch.compile(fn, fullgraph=True)


def _compiled_replacement(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The replacement's call under torch.compile as the server would trace it; torch.compile's refusal is
    re-raised as one that says so (Dynamo's own message is mostly advice, its cause line the useful part)."""
    import torch

    run = _compiled(fn)

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return run(*args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as exc:
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            cause = next((ln for ln in lines if ln.startswith("Caused by:")), "")
            what = (cause.removeprefix("Caused by:").strip() or (lines[0] if lines else ""))[:160]
            raise RuntimeError(f"torch.compile can't trace it as one graph, as the server would "
                               f"({type(exc).__name__}): {what}") from None
    return call


class _NormLayer:
    """The stand-in RMSNorm layer the replacement's ``forward`` gets as ``self``."""

    def __init__(self, weight: Any, eps: float) -> None:
        self.weight, self.variance_epsilon, self.variance_size_override = weight, eps, None
        self.has_weight, self.stock_forward = True, None


class _SiluLayer:
    """The stand-in SiluAndMul layer (its stock method is vLLM's ``forward_native``)."""

    stock_forward = staticmethod(vllm_silu_mul)


def _rmsnorm_impl(source: str, name: str, compiled: bool = False) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(the gates' implementation, writing ``out``; the forward as the server calls it, which the microbenchmark
    times against stock's op: both return their results, neither copies)."""
    fwd = replacement_forward(source, name)

    def call(hidden_states: Any, residual: Any, weight: Any, eps: float) -> Any:
        return fwd(_NormLayer(weight, eps), hidden_states, residual)
    run = _compiled_replacement(call) if compiled else call

    def implementation(hidden_states: Any, residual: Any, weight: Any, eps: float, out: Any) -> Any:
        res = run(hidden_states, residual, weight, eps)
        out.copy_(res[0] if isinstance(res, tuple) else res)
        return out
    return implementation, run


def _silu_impl(source: str, name: str, compiled: bool = False) -> tuple[Callable[..., Any], Callable[..., Any]]:
    fwd = replacement_forward(source, name)

    def call(x: Any) -> Any:
        return fwd(_SiluLayer(), x)
    run = _compiled_replacement(call) if compiled else call

    def implementation(x: Any, out: Any) -> Any:
        out.copy_(run(x))
        return out
    return implementation, run


def _checked_dtype(dtype: str, cfg: Mapping[str, Any]) -> str:
    """The dtype the gates' tensors have: the stack's, or for ``auto`` (vLLM: the checkpoint's) the model
    config's ``torch_dtype`` / ``dtype``, bfloat16 where it names none (vLLM's CPU default for half)."""
    if dtype != "auto":
        return dtype
    named = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return named if named in ("float32", "bfloat16", "float16") else "bfloat16"


def _inputs_at(tensors: str, make: Callable[..., tuple[dict[str, Any], Any]]) -> Callable[..., tuple[dict[str, Any], Any]]:
    def make_inputs(shape: Mapping[str, int], dtype: str, device: str, seed: int) -> tuple[dict[str, Any], Any]:
        return make(shape, tensors if dtype == "auto" else dtype, device, seed)
    return make_inputs


#: per op: (the gate's implementation from the source, the baseline, the reference, the inputs, the shape's
#: width key and the model config's field for it)
_OPS: dict[str, tuple[Callable[..., tuple[Callable[..., Any], Callable[..., Any]]], Callable[..., Any], Callable[..., Any],
                      Callable[..., tuple[dict[str, Any], Any]], str, str]] = {
    "RMSNorm": (_rmsnorm_impl, vllm_rmsnorm, rmsnorm_reference, rmsnorm_inputs, "hidden", "hidden_size"),
    "SiluAndMul": (_silu_impl, vllm_silu_mul, silu_mul_reference, silu_mul_inputs, "intermediate",
                   "intermediate_size"),
}


class VLLMPluginBackend:
    """See the module docstring."""

    name = "vllm_plugin"
    guarded = True  # the KERNEL phase runs the reward-hacking guards first (kernels/guards.py)

    def unavailable(self, workload: Mapping[str, Any]) -> str | None:
        device = str(workload.get("device"))
        if not any(device in r.devices for r in REPLACEMENTS.values()):
            return f"no kernel plugin replacement runs on {device}"
        try:
            model_config(str(workload.get("model")))
        except (OSError, ValueError, KeyError) as exc:
            return f"the model's config can't be read for the replacements' shapes ({exc})"
        return None

    def rewritable(self) -> frozenset[str]:
        return frozenset(r.category for r in REPLACEMENTS.values())

    def fixed_order(self) -> tuple[str, ...]:
        return FIXED_ORDER

    def knobs(self) -> frozenset[str]:
        """The knobs its candidates switch (the KERNEL phase skips it when the spec pins them all)."""
        return frozenset({PLUGIN_KNOB})

    def merge(self, stack: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
        """A candidate's changes against ``stack``: its replacement added to the plugin the stack already
        loads (a candidate kept earlier in the phase), not swapped for it (``vllm_kernel_overlays.combine``)."""
        out = dict(changes)
        if PLUGIN_KNOB in out:
            out[PLUGIN_KNOB] = combine(str(stack.get(PLUGIN_KNOB, "none")), str(out[PLUGIN_KNOB]))
        return out

    def propose(self, targets: Sequence[Target], workload: Mapping[str, Any]) -> list[KernelCandidate]:
        picked = [t.category for t in targets if t.picked]
        stack = workload.get("stack", {})
        have = {REPLACEMENTS[v].op for v in str(stack.get(PLUGIN_KNOB, "none")).split("+") if v in REPLACEMENTS}
        have |= written_ops(str(stack.get(WRITTEN_KNOB, "none")))  # an op a kept written kernel replaces
        device = str(workload.get("device"))
        out = []
        for cat in picked:  # hottest first (the profile's order), then the replacements' order
            for value, r in REPLACEMENTS.items():
                if r.category != cat or device not in r.devices or r.op not in _OPS or r.op in have:
                    continue  # an op the stack's plugin already replaces is not replaced again
                src = r.build()
                out.append(server_candidate(
                    r.op, src.source, value, workload, id=f"plugin-{value.replace('_', '-')}", target=cat,
                    claimed_speedup=r.claimed_speedup, config_changes={PLUGIN_KNOB: value},
                    notes=f"{r.notes}; delivered as a vllm.general_plugins overlay on the server's PYTHONPATH",
                    stock=r.stock))
        return out


def server_candidate(op: str, source: str, name: str, workload: Mapping[str, Any], *, id: str, target: str,
                     claimed_speedup: float, config_changes: Mapping[str, Any], notes: str,
                     stock: str = "vLLM's native op") -> KernelCandidate:
    """A replacement of vLLM's ``op`` (``RMSNorm``, ``SiluAndMul``: its module's ``source``) as the workload's
    server runs it: its ``forward`` with a stand-in layer, against vLLM's native op, both compiled when the
    server compiles (:func:`server_compiles`), at the decode batch and a prefill shape, the reference float64."""
    dtype = str(workload["dtype"])
    cfg = model_config(str(workload["model"]))
    tensors = _checked_dtype(dtype, cfg)
    compiled = server_compiles(workload)
    mode = ("both compiled with torch.compile, as the server compiles its model" if compiled
            else "both eager, as the server runs (--enforce-eager / -O0)")
    b = int(workload["batch"])
    prefill = min(b * int(workload["input_len"]), PREFILL_TOKENS_CHECKED)
    impl, base, ref, inputs, width, field = _OPS[op]
    w = int(cfg[field])
    implementation, timed = impl(source, name, compiled)
    return KernelCandidate(
        id=id, target=target,
        op=(f"vLLM {op} (register_oot; stock: vLLM's native composition under inductor, as the server compiles it; "
            "compiled)" if compiled else f"vLLM {op} (register_oot, {stock}; eager)"),
        implementation=implementation, timed=timed, baseline=_compiled(base) if compiled else base, reference=ref,
        make_inputs=_inputs_at(tensors, inputs), shapes=({"tokens": b, width: w}, {"tokens": prefill, width: w}),
        dtype=dtype, claimed_speedup=claimed_speedup, config_changes=dict(config_changes),
        tolerance=dict(TOLERANCES.get(tensors, TOLERANCES["bfloat16"])),
        notes=f"{notes}; gates: the replacement and stock {mode}; claim x{claimed_speedup} (a guess, unverified)")


def written_as_served(workload: Mapping[str, Any], entry: str, name: str, path: Path,
                      claimed_speedup: float = 1.0) -> KernelCandidate | None:
    """The written kernel ``name`` (catalog ``entry``, its module at ``path``) as the workload's server would run
    it: the plugin's replacement (the author's module and the generated ``forward``, ``vllm_written``) through
    :func:`server_candidate`, for the gates' second look (the framework descriptor's ``written_served``); None for
    an entry the server does not take."""
    r = written_replacement(entry, name, Path(path))
    if r is None:
        return None
    return server_candidate(r.op, r.source, name, workload, id=f"llm:{name}", target=entry,
                            claimed_speedup=claimed_speedup, config_changes={},
                            notes=f"the written {entry} kernel as the server runs it (the author's claim)",
                            stock=f"vLLM's {r.op}")
