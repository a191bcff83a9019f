"""The KERNEL phase's backend for vLLM servers: ``register_oot`` replacements delivered through the plugin
overlay (``vllm_plugins``), switched on end to end by the knob ``kernel_plugin`` (``vllm_kernel_overlays``).

The framework descriptor names it (``Framework.kernel_backend``); ``spec.kernels.backend: auto`` runs it.

* Targets: the server's own profile when the session has one; a server's PRELUDE records none
  (``frameworks.SERVER_PROFILE_SKIPPED``), so the phase falls back to :data:`FIXED_ORDER` (the categories
  this backend has replacements for, in that order; the progress line says so) with no time share: no
  Amdahl bound is claimed for them.
* Candidates (:data:`~inferloom.workloads.vllm_kernel_overlays.REPLACEMENTS`): ``plugin-torch-rmsnorm``
  (target ``normalization``; ``kernel_plugin=torch_rmsnorm``): vLLM's RMSNorm (``ir.ops.rms_norm`` /
  ``fused_add_rms_norm``, its native composition: the stock op on CPU) -> ``F.rms_norm`` over float32
  (``vllm_replacements.torch_rmsnorm``).
* The gates run the replacement's own source (the bytes the overlay carries) in this process on small
  tensors, before any server starts: the module is executed, its ``forward`` called with a stand-in layer
  (``weight``, ``variance_epsilon``; ``stock_forward`` = vLLM's composition), with a residual (the
  decoder's fused add) at the decode and a prefill shape; the baseline the microbenchmark races is vLLM
  0.32's ``fused_add_rms_norm`` composition op for op, the reference float64.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Mapping, Sequence

from inferloom.kernels.base import KernelCandidate, Target, model_config
from inferloom.models.presets import parse_dtype
from inferloom.workloads.vllm_kernel_overlays import PLUGIN_KNOB, REPLACEMENTS

__all__ = ["VLLMPluginBackend", "FIXED_ORDER", "vllm_rmsnorm", "rmsnorm_reference", "rmsnorm_inputs",
           "replacement_forward", "PREFILL_TOKENS_CHECKED"]

#: the categories the backend tries, in this order, when the session has no profile of the server
FIXED_ORDER: tuple[str, ...] = ("normalization",)
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
    """vLLM 0.32's ``ir.ops.fused_add_rms_norm`` (the stock op on CPU), op for op; the normalised output."""
    import torch

    dt = hidden_states.dtype
    x = hidden_states.to(torch.float32) + residual.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x.to(weight.dtype) * weight).to(dt)


def rmsnorm_reference(hidden_states: Any, residual: Any, weight: Any, eps: float) -> Any:
    """The truth in float64."""
    import torch

    x = hidden_states.to(torch.float64) + residual.to(torch.float64)
    return weight.to(torch.float64) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def replacement_forward(source: str, name: str) -> Callable[..., Any]:
    """The ``forward`` of a replacement's source, executed as its own module (as the plugin imports it)."""
    mod = types.ModuleType(f"inferloom_gate_{name}")
    exec(compile(source, f"<kernel_plugin {name}>", "exec"), mod.__dict__)  # noqa: S102 - inferloom's own source
    return mod.forward


def _rmsnorm_impl(source: str, name: str) -> Callable[..., Any]:
    fwd = replacement_forward(source, name)

    def implementation(hidden_states: Any, residual: Any, weight: Any, eps: float, out: Any) -> Any:
        layer = types.SimpleNamespace(weight=weight, variance_epsilon=eps, variance_size_override=None,
                                      has_weight=True, stock_forward=None)
        res = fwd(layer, hidden_states, residual)
        out.copy_(res[0] if isinstance(res, tuple) else res)
        return out
    return implementation


def _checked_dtype(dtype: str, cfg: Mapping[str, Any]) -> str:
    """The dtype the gates' tensors have: the stack's, or for ``auto`` (vLLM: the checkpoint's) the model
    config's ``torch_dtype`` / ``dtype``, bfloat16 where it names none (vLLM's CPU default for half)."""
    if dtype != "auto":
        return dtype
    named = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return named if named in ("float32", "bfloat16", "float16") else "bfloat16"


def _inputs_at(tensors: str) -> Callable[..., tuple[dict[str, Any], Any]]:
    def make_inputs(shape: Mapping[str, int], dtype: str, device: str, seed: int) -> tuple[dict[str, Any], Any]:
        return rmsnorm_inputs(shape, tensors if dtype == "auto" else dtype, device, seed)
    return make_inputs


class VLLMPluginBackend:
    """See the module docstring."""

    name = "vllm_plugin"

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

    def propose(self, targets: Sequence[Target], workload: Mapping[str, Any]) -> list[KernelCandidate]:
        picked = [t.category for t in targets if t.picked]
        stack = workload.get("stack", {})
        if str(stack.get(PLUGIN_KNOB, "none")) != "none":
            return []  # one plugin per stack (the knob's one value): nothing more to switch on
        device, dtype = str(workload.get("device")), str(workload["dtype"])
        cfg = model_config(str(workload["model"]))
        tensors = _checked_dtype(dtype, cfg)
        hidden, b = int(cfg["hidden_size"]), int(workload["batch"])
        out = []
        for cat in picked:
            for value, r in REPLACEMENTS.items():
                if r.category != cat or device not in r.devices or r.op != "RMSNorm":
                    continue
                src = r.build()
                shapes = ({"tokens": b, "hidden": hidden},
                          {"tokens": min(b * int(workload["input_len"]), PREFILL_TOKENS_CHECKED), "hidden": hidden})
                out.append(KernelCandidate(
                    id=f"plugin-{value.replace('_', '-')}", target=cat, op=f"vLLM {r.op} (register_oot, {r.stock})",
                    implementation=_rmsnorm_impl(src.source, value), baseline=vllm_rmsnorm,
                    reference=rmsnorm_reference, make_inputs=_inputs_at(tensors), shapes=shapes, dtype=dtype,
                    claimed_speedup=r.claimed_speedup, config_changes={PLUGIN_KNOB: value},
                    tolerance={"rel_l2": 1e-2, "max_rel": 2e-2},
                    notes=f"{r.notes}; delivered as a vllm.general_plugins overlay on the server's PYTHONPATH; "
                          f"claim x{r.claimed_speedup} (a guess, unverified)"))
        return out
