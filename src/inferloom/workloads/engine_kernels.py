"""The transformers engine's kernel switches: its KERNEL-phase knobs applied to a built model.

``rmsnorm_impl``: every module whose class name ends in ``RMSNorm`` and that
has ``weight`` and ``variance_epsilon`` (Llama-style, as in transformers) gets
its ``forward`` replaced on the instance:

* ``eager``: untouched (transformers' own ops: fp32 upcast, mean of squares,
  rsqrt, scale, cast back, multiply by the weight).
* ``torch_fused``: :func:`torch.nn.functional.rms_norm` with the same
  epsilon, computed in fp32 and cast back, then the weight, in the module's
  own order (one fused kernel where torch has it; same numerics up to
  rounding): :func:`inferloom.kernels.torch_ops.fused_rmsnorm`.

The module's class is never changed, so anything else (hooks, state dicts)
is unaffected; the replacement is recorded in the handle's notes.

``attention_kernel``: anything but ``sdpa`` registers the decode attention
function of :mod:`inferloom.workloads.engine_attention` with transformers and sets it
as the model's attention implementation (decode steps use it; prefill goes to
SDPA).

``mlp_kernel``: anything but ``eager`` fuses every Llama-style MLP's gate and
up projections into one ``[2I, H]`` weight (the separate ones released) and
replaces the module's ``forward`` on the instance: one GEMM + SiLU·mul
(``torch_gate_up``) or the catalog's Triton GEMM with a SiLU·mul epilogue
(``triton_gate_up_silu``, CUDA); see :mod:`inferloom.workloads.engine_gate_up`.

``llm_kernel`` (only in a session with the LLM kernel author): a written
kernel whose gates passed, or a combination of them (each applied), in the
modules it rewrites; see :mod:`inferloom.workloads.engine_written` (the
kernels: :mod:`inferloom.kernels.written`, :mod:`inferloom.kernels.written_set`).
"""

from __future__ import annotations

from typing import Any, Mapping

from inferloom.kernels.torch_ops import fused_rmsnorm
from inferloom.workloads.engine_attention import register
from inferloom.workloads.engine_gate_up import apply_mlp_kernel
from inferloom.workloads.engine_written import apply as apply_written

__all__ = ["apply_kernels", "KERNEL_KNOBS"]

KERNEL_KNOBS = ("rmsnorm_impl", "attention_kernel", "mlp_kernel")


def _rmsnorm_modules(model: Any) -> list[Any]:
    return [m for m in model.modules()
            if type(m).__name__.endswith("RMSNorm") and hasattr(m, "weight") and hasattr(m, "variance_epsilon")]


def apply_kernels(model: Any, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Apply the kernel knobs of ``cfg`` to ``model`` in place; returns notes."""
    notes: dict[str, Any] = {}
    impl = cfg.get("rmsnorm_impl", "eager")
    if impl != "eager":
        mods = _rmsnorm_modules(model)
        if not mods:
            raise ValueError(f"rmsnorm_impl={impl}: the model has no Llama-style RMSNorm module to replace")
        for m in mods:
            if impl == "torch_fused":
                m.forward = (lambda mod: (lambda hidden_states: fused_rmsnorm(hidden_states, mod.weight,
                                                                               mod.variance_epsilon)))(m)
            else:
                raise ValueError(f"rmsnorm_impl={impl!r}: unknown implementation")
        notes["rmsnorm_impl"] = f"{impl}: {len(mods)} modules"
    attn = cfg.get("attention_kernel", "sdpa")
    if attn != "sdpa":
        name = register(attn)
        model.set_attn_implementation(name)
        notes["attention_kernel"] = f"{attn}: decode steps through {name}, prefill through sdpa"
    mlp = cfg.get("mlp_kernel", "eager")
    if mlp != "eager":
        notes["mlp_kernel"] = apply_mlp_kernel(model, mlp)
    written = cfg.get("llm_kernel", "none")  # only in a session with the LLM kernel author
    if written != "none":
        notes["llm_kernel"] = apply_written(model, written)  # each member of a combination
    return notes
