"""The ``catalog`` kernel backend: inferloom's Triton kernels (``kernels/catalog``)
for the transformers engine on CUDA.

It proposes only catalog entries that the engine can switch on end to end:

* ``decode_attention`` (target ``attention``; ``attention_kernel=triton_decode``):
  split-KV (flash-decoding) attention of each decode step over only the
  valid ``[start, end)`` range of every row of the static cache, through the
  catalog's compile-safe custom op, so it stays inside compiled graphs and
  CUDA graphs. Proposed when the stack uses the static cache with the sdpa
  attention path. Checked at the workload's decode shape (mean context of
  the cache) and at a ragged, left-padded batch.

* ``gate_up_silu`` (target ``gemm``; ``mlp_kernel=triton_gate_up_silu``):
  the Llama MLP's gate and up GEMMs as one Triton GEMM over the
  concatenated ``[2I, H]`` weight with a SiLU·mul epilogue (the engine fuses
  the weights once and releases the separate ones; through the catalog's
  custom op, so compiled graphs and CUDA graphs keep it). Proposed while
  ``mlp_kernel`` is ``eager``, after the decode-attention candidate. Checked
  at the workload's decode shape (``tokens`` = batch) and at a prefill chunk
  (``tokens`` = batch x input_len, at most 256); claimed x1.2 on the op (a
  guess: the ``[tokens, 2I]`` intermediate and the SiLU and mul kernels go).

* ``add_rmsnorm`` without a residual (target ``normalization``;
  ``rmsnorm_impl=triton``) for an image pipeline (``framework: diffusers``)
  whose denoiser has eager q/k RMSNorms (``qk_norm: rms_norm``): checked at
  the workload's rows (batch x heads x tokens, ``head_dim`` wide) and at 64.

The other entries (fused residual + RMSNorm for the transformers engine, SiLU·mul alone, fused QKV, fp8
linear) have their correctness and microbenchmark in
``benchmarks/gpu_kernels.py`` but no engine switch yet; the backend does not
propose them (``NOT_SWITCHABLE``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from inferloom.frameworks import described
from inferloom.kernels.base import KernelCandidate, Target, model_config, no_image_op as _no_image_op
from inferloom.kernels.catalog import triton_available, workload_shapes
from inferloom.models.decode_shapes import mean_decode_context

__all__ = ["CatalogBackend", "decode_attention_shape", "DECODE_ATTENTION_COVERS"]

NOT_SWITCHABLE = ("add_rmsnorm", "silu_mul", "qkv_proj", "fp8_linear")
PREFILL_TOKENS_CHECKED = 256  # the prefill shape's token count is capped: the float64 reference is [tokens, 2I]


# what the decode attention kernel's op also spends besides the attention kernels (the Amdahl share of the catalog's
# candidate and of a written one, kernels/written.py): repeat_kv's copy of the whole cache, a copy kernel in eager,
# an inductor "triton_poi_fused_..." kernel (elementwise) when compiled
DECODE_ATTENTION_COVERS: tuple[str, ...] = ("memory_copy", "elementwise")

def decode_attention_shape(workload: Mapping[str, Any]) -> dict[str, int]:
    """``decode_attention``'s shape at the workload's mean decode step: its static cache of
    ``input_len + output_len`` slots holding the mean decode context (the catalog backend's candidate and the
    LLM kernel author's shown shapes)."""
    cache = int(workload["input_len"]) + int(workload["output_len"])
    ctx = min(cache, int(round(mean_decode_context(int(workload["input_len"]), int(workload["output_len"])))))
    return workload_shapes(model_config(str(workload["model"])), int(workload["batch"]), ctx, cache)["decode_attention"]


class CatalogBackend:
    """See the module docstring."""

    name = "catalog"

    def unavailable(self, workload: Mapping[str, Any]) -> str | None:
        fw = described(workload.get("framework"))
        if fw is None or not fw.kernel_engine:  # not an in-process engine whose modules a backend rewrites
            return (f"the catalog rewrites the transformers and diffusers engines' modules, not "
                    f"{workload.get('framework')}")
        if _no_image_op(workload):
            return _no_image_op(workload)
        if workload.get("device") != "cuda":
            return "the Triton catalog runs on CUDA (on a CPU only under the Triton interpreter, for tests)"
        if not triton_available():
            return "triton is not installed"
        return None

    def rewritable(self) -> frozenset[str]:
        return frozenset({"attention", "gemm", "normalization"})

    def propose(self, targets: Sequence[Target], workload: Mapping[str, Any]) -> list[KernelCandidate]:
        picked = {t.category for t in targets if t.picked}
        fw = described(workload.get("framework"))
        if fw is not None and fw.image:
            return self._image_rmsnorm(workload) if "normalization" in picked else []
        stack = workload.get("stack", {})
        out: list[KernelCandidate] = []
        if ("attention" in picked and stack.get("cache_implementation") == "static"
                and stack.get("attention_kernel", "sdpa") == "sdpa" and stack.get("attn_implementation", "sdpa") == "sdpa"):
            entry = _entry("decode_attention")
            dtype = str(workload["dtype"])
            why = entry.unsupported(dtype, str(workload.get("device", "cuda")))
            if why is None:
                shape = decode_attention_shape(workload)
                cache, ctx = shape["max_len"], shape["context"]
                out.append(KernelCandidate(
                    id="catalog-decode-attention", target="attention", op=entry.target_op,
                    implementation=entry.implementation, baseline=entry.baseline, reference=entry.reference,
                    make_inputs=entry.make_inputs,
                    shapes=(shape, {**shape, "ragged": 1, "left_pad": 1}),
                    dtype=dtype, claimed_speedup=cache / max(1, ctx),
                    config_changes={"attention_kernel": "triton_decode"}, tolerance=dict(entry.tolerance(dtype)),
                    covers=DECODE_ATTENTION_COVERS,
                    notes=entry.notes + "; claim = cache length / mean context (a guess: it reads only the valid range)"))
        if "gemm" in picked and stack.get("mlp_kernel", "eager") == "eager":
            out.extend(self._gate_up(workload))
        return out

    def _gate_up(self, workload: Mapping[str, Any]) -> list[KernelCandidate]:
        """The ``gate_up_silu`` entry as a candidate (none for this dtype or device, or a non-Llama MLP)."""
        entry = _entry("gate_up_silu")
        dtype = str(workload["dtype"])
        cfg = model_config(str(workload["model"]))
        if not cfg.get("intermediate_size") or entry.unsupported(dtype, str(workload.get("device", "cuda"))):
            return []
        batch, cache = int(workload["batch"]), int(workload["input_len"]) + int(workload["output_len"])
        shape = workload_shapes(cfg, batch, cache, cache)["gate_up_silu"]
        prefill = {**shape, "tokens": min(batch * int(workload["input_len"]), PREFILL_TOKENS_CHECKED)}
        return [KernelCandidate(
            id="catalog-gate-up-silu", target="gemm", op=entry.target_op,
            implementation=entry.implementation, baseline=entry.baseline, reference=entry.reference,
            make_inputs=entry.make_inputs, shapes=(shape, prefill), dtype=dtype, claimed_speedup=1.2,
            config_changes={"mlp_kernel": "triton_gate_up_silu"}, tolerance=dict(entry.tolerance(dtype)),
            notes=entry.notes + "; claim x1.2 (a guess: no [tokens, 2I] intermediate, no SiLU and mul kernels)")]


    def _image_rmsnorm(self, workload: Mapping[str, Any]) -> list[KernelCandidate]:
        """The ``add_rmsnorm`` entry without a residual (a plain RMSNorm) for the denoiser's eager q/k norms."""
        d = workload.get("diffusion") or {}
        if not d.get("rmsnorms") or workload.get("stack", {}).get("rmsnorm_impl", "eager") != "eager":
            return []
        entry = _entry("add_rmsnorm")
        dtype = str(workload["dtype"])
        if entry.unsupported(dtype, str(workload.get("device", "cuda"))):
            return []
        shape = {"tokens": int(d["rms_rows"]), "hidden": int(d["head_dim"]), "no_residual": 1}
        return [KernelCandidate(
            id="catalog-rmsnorm", target="normalization", op="diffusers RMSNorm.forward (eager q/k norm, 5+ ops)",
            implementation=entry.implementation, baseline=entry.baseline, reference=entry.reference,
            make_inputs=entry.make_inputs, shapes=(shape, {**shape, "tokens": min(shape["tokens"], 64)}),
            dtype=dtype, claimed_speedup=1.5, config_changes={"rmsnorm_impl": "triton"},
            tolerance=dict(entry.tolerance(dtype)),
            notes=entry.notes + f"; {d['rmsnorms']} modules of the denoiser; claim x1.5 (a guess: one kernel for 5+)")]


def _entry(name: str) -> Any:
    """The catalog entry ``name`` (a :class:`~inferloom.kernels.catalog.entry.CatalogEntry`). Imports the
    kernel modules, so it needs triton: only reached once :meth:`CatalogBackend.unavailable` found it."""
    from inferloom.kernels.catalog.index import get

    return get(name)
