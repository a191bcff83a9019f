"""Op categorisation: which category of work an op, kernel or module label is.

A profile (:mod:`inferloom.measure.profile`) groups its time into these categories:

========================  =====================================================
``gemm``                  matrix products (matmul, addmm, linear, cuBLAS / nvjet / CUTLASS GEMMs)
``attention``             SDPA / flash / memory-efficient attention kernels, softmax,
                          and the non-GEMM work inside an attention module
``normalization``         RMSNorm / LayerNorm (an op, or anything inside a norm module)
``elementwise``           activations and pointwise / reduction ops (silu, mul, add, ...)
``memory_copy``           copies, concatenations, cache writes, casts, memcpy / memset
``communication``         collectives (NCCL, all_reduce, ...)
``other``                 ops no pattern matches (views, bookkeeping)
``idle``                  idle / launch gaps: on CUDA the wall time of the run minus the
                          time at least one kernel was running (the union of kernel
                          intervals); on CPU the wall time not covered by top-level ops
                          (Python, framework and dispatch overhead between ops)
========================  =====================================================

:func:`categorize` is a pure function of a name (op, kernel or module label)
driven by the :data:`CATEGORY_PATTERNS` table; :func:`attribute` is a pure
function of one unit of work's context (kernel, op stack, module stack).
"""

from __future__ import annotations

import re
from typing import Sequence

__all__ = ["CATEGORIES", "CATEGORY_LABELS", "CATEGORY_PATTERNS", "categorize", "attribute"]


# Every category a profile reports, in display order ("idle" is never
# returned by categorize(); it is the time nothing was running).
CATEGORIES: tuple[str, ...] = (
    "gemm",
    "attention",
    "normalization",
    "elementwise",
    "memory_copy",
    "communication",
    "other",
    "idle",
)

CATEGORY_LABELS: dict[str, str] = {
    "gemm": "GEMM",
    "attention": "attention",
    "normalization": "normalization",
    "elementwise": "elementwise / activation",
    "memory_copy": "memory copy",
    "communication": "communication",
    "other": "other",
    "idle": "idle / launch gaps (host)",
}

# The classification table: (category, regular expressions searched in the
# lower-cased name). The first category with a matching pattern wins, so the
# order matters: attention before GEMM (cuDNN / CUTLASS attention kernels
# carry "cutlass" or "gemm"-like names), normalization before copies and
# elementwise (an inductor kernel "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt"
# is an RMSNorm), copies before elementwise (copy kernels are
# "elementwise_kernel<...direct_copy_kernel...>").
CATEGORY_PATTERNS: list[tuple[str, tuple[str, ...]]] = [
    (
        "communication",
        (
            r"nccl", r"all_?reduce", r"all_?gather", r"reduce_?scatter", r"all_?to_?all",
            r"c10d::", r"gloo", r"\bbroadcast_", r"rccl",
        ),
    ),
    # MoE layers (vLLM's Triton ``fused_moe_kernel``, grouped GEMMs): the experts' matrix products; their routing
    # (``topkGatingSoftmax``, ``moe_align_block_size``, ``moe_sum``) is pointwise / reduction work. Both before
    # attention, whose "softmax" would take the gating kernel.
    ("gemm", (r"fused_moe", r"moe_?gemm", r"grouped_?gemm", r"moe_?mm")),
    ("elementwise", (r"topk_?gating", r"topk_?softmax", r"moe_?softmax", r"moe_?top_?k", r"moe_?align", r"moe_?sum",
                     r"sort_?expert", r"expert_?tokens")),
    (
        "attention",
        (
            r"scaled_dot_product", r"sdpa", r"flash", r"fmha", r"attention", r"attn",
            r"softmax", r"flex_",
        ),
    ),
    (
        "normalization",
        (
            r"rms_?norm", r"layer_?norm", r"group_?norm", r"batch_?norm", r"instance_?norm",
            r"rsqrt",
        ),
    ),
    (
        "gemm",
        (
            r"matmul", r"addmm", r"baddbmm", r"bmm", r"(^|[^a-z])mm([^a-z]|$)", r"linear",
            r"cublas", r"nvjet", r"gemm", r"gemv", r"cutlass", r"xmma", r"_scaled_mm",
            r"aten::(v)?dot\b", r"mkldnn_matmul", r"onednn", r"hipblas", r"rocblas",
        ),
    ),
    # inductor's fused pointwise / reduction kernels carry the names of the
    # ops they fuse ("triton_poi_fused__to_copy_mul_silu_0"): elementwise work,
    # not a copy (norm / attention / GEMM kernels matched above)
    ("elementwise", (r"^triton_(poi|red|per)_",)),
    (
        "memory_copy",
        (
            r"copy", r"aten::cat\b", r"catarray", r"concat", r"aten::stack\b", r"index_put",
            r"scatter", r"gather", r"index_select", r"embedding", r"aten::to\b", r"contiguous",
            r"clone", r"memcpy", r"memset", r"fill_", r"zero_", r"aten::(zeros|ones|full|empty)",
            r"local_scalar_dense", r"aten::item\b", r"dtoh|htod|dtod",
        ),
    ),
    (
        "elementwise",
        (
            r"silu", r"gelu", r"relu", r"swiglu", r"sigmoid", r"tanh",
            r"aten::(exp|log|add|sub|mul|div|neg|pow|sqrt|abs|sin|cos|where|masked_fill|clamp|"
            r"eq|ne|lt|le|gt|ge|bitwise_\w+|logical_\w+|__and__|__or__|__xor__|__invert__|"
            r"mean|sum|max|min|amax|amin|argmax|argmin|any|all|cumsum|isin|arange|rsub|"
            r"lerp|erf|reciprocal|maximum|minimum|sign|floor|ceil|round|remainder|fmod)_?\b",
            r"elementwise", r"vectorized", r"pointwise", r"reduce_kernel", r"reduction",
            r"rotary", r"\brope\b",
        ),
    ),
]

_COMPILED = [(cat, tuple(re.compile(p) for p in pats)) for cat, pats in CATEGORY_PATTERNS]


def categorize(op_name: str) -> str:
    """Category of one op, kernel or module label by name (first matching
    row of :data:`CATEGORY_PATTERNS`), ``"other"`` when nothing matches."""
    name = str(op_name or "").lower()
    for cat, pats in _COMPILED:
        for pat in pats:
            if pat.search(name):
                return cat
    return "other"


def attribute(
    kernel: str | None = None,
    ops: Sequence[str] = (),
    modules: Sequence[str] = (),
) -> str:
    """Category of one unit of work from its context.

    ``kernel``: the device kernel's name (CUDA), or None for host time;
    ``ops``: the op stack that launched it, innermost first (``aten::mm``,
    ..., ``aten::linear``); ``modules``: the enclosing module labels,
    innermost first (``module::LlamaRMSNorm``, ``module::LlamaAttention``).

    Rules, in order:

    1. inside a normalization module, or under a normalization op -> normalization;
    2. the outermost op names the work (``aten::scaled_dot_product_attention``
       owns the copies and GEMMs it runs inside); when it matches nothing
       (a compiled region, a custom op), the kernel's name decides, then the
       inner ops;
    3. inside an attention module, a GEMM that is not a ``Linear``
       projection (eager attention's ``matmul``), an elementwise op (RoPE,
       masking) or an unmatched op count as attention; copies (the KV-cache
       update) stay memory copies.
    """
    ops = [o for o in ops if o]
    mod_cats = [categorize(m) for m in modules if m]
    if "normalization" in mod_cats or any(categorize(o) == "normalization" for o in ops):
        return "normalization"
    top = ops[-1] if ops else None
    cat = categorize(top) if top else "other"
    if cat == "other" and kernel:
        cat = categorize(kernel)
    if cat == "other":
        for o in ops[:-1]:
            c = categorize(o)
            if c != "other":
                cat = c
                break
    # the innermost module with a category (skips MLP, decoder layer, ...)
    inner_scope = next((c for c in mod_cats if c != "other"), None)
    if inner_scope == "attention" and cat in ("elementwise", "other"):
        return "attention"
    if inner_scope == "attention" and cat == "gemm" and not any("linear" in o.lower() for o in ops):
        return "attention"
    return cat

