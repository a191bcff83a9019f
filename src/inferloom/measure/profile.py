"""Profile one run: where the time of a configuration goes, by category.

:func:`profile_run` performs **one extra, untimed** run of an adapter under
``torch.profiler`` (CPU activities, plus CUDA when the configuration runs on a
CUDA device) and groups the time into categories:

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

Shares are fractions of the profiled wall time and sum to 1.

Contract:

* The profiled run is never a timed measurement: the caller must not put its
  record in a ledger or a comparison. Profiling adds overhead (absolute
  seconds are inflated; shares are what the profile is for). Run it on a
  warmed-up configuration (after the warm-up runs), with a seed that no timed
  run uses.
* The adapter and handle are left as they were: the only thing added during
  the run is one ``record_function`` label per normalization / attention
  module (forward hooks, removed afterwards), and only on an uncompiled
  ``handle.model``; a compiled configuration is profiled without hooks (hooks
  would make dynamo recompile).
* :func:`categorize` is a pure function of a name (op, kernel or module label)
  driven by the :data:`CATEGORY_PATTERNS` table; :func:`attribute` is a pure
  function of one unit of work's context (kernel, op stack, module stack).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections import defaultdict
from typing import Any, Iterable, Iterator, Mapping, Sequence

__all__ = [
    "CATEGORIES",
    "CATEGORY_LABELS",
    "CATEGORY_PATTERNS",
    "categorize",
    "attribute",
    "profile_run",
    "profile_config",
]

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

# Module classes whose forward gets a record_function label while profiling.
_SCOPE_CATEGORIES = frozenset({"normalization", "attention"})
_MODULE_PREFIX = "module::"
_ROOT_LABEL = "inferloom::profile_run"


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


# ----------------------------------------------------------------- hooks
@contextlib.contextmanager
def _module_labels(model: Any) -> Iterator[bool]:
    """While active, each normalization / attention module's forward runs
    inside ``record_function("module::<ClassName>")``. Yields whether labels
    were installed."""
    import torch
    from torch.autograd.profiler import record_function

    if model is None or not isinstance(model, torch.nn.Module):
        yield False
        return
    open_labels: list[Any] = []
    handles: list[Any] = []

    def make_hooks(label: str) -> tuple[Any, Any]:
        stack: list[Any] = []

        def pre(_mod: Any, _args: Any) -> None:
            rf = record_function(label)
            rf.__enter__()
            stack.append(rf)
            open_labels.append(rf)

        def post(_mod: Any, _args: Any, _out: Any) -> None:
            if stack:
                rf = stack.pop()
                rf.__exit__(None, None, None)
                try:
                    open_labels.remove(rf)
                except ValueError:  # pragma: no cover
                    pass

        return pre, post

    try:
        for mod in model.modules():
            label = _MODULE_PREFIX + type(mod).__name__
            if categorize(label) not in _SCOPE_CATEGORIES:
                continue
            pre, post = make_hooks(label)
            handles.append(mod.register_forward_pre_hook(pre))
            handles.append(mod.register_forward_hook(post))
        yield bool(handles)
    finally:
        for h in handles:
            h.remove()
        for rf in reversed(open_labels):  # a forward that raised leaves its label open
            with contextlib.suppress(Exception):
                rf.__exit__(None, None, None)


def _is_compiled(handle: Any) -> bool:
    cfg = getattr(handle, "config", None)
    if isinstance(cfg, dict) and cfg.get("compile_mode", "off") not in ("off", None):
        return True
    model = getattr(handle, "model", None)
    fwd = getattr(model, "forward", None)
    return bool(
        getattr(fwd, "_torchdynamo_orig_callable", None)
        or getattr(fwd, "_orig_mod", None)
        or type(model).__name__ == "OptimizedModule"
    )


# ------------------------------------------------------------- analysis
def _dur_us(evt: Any) -> float:
    tr = evt.time_range
    return float(tr.end - tr.start)


def _is_cpu(evt: Any) -> bool:
    from torch.autograd import DeviceType

    return getattr(evt, "device_type", DeviceType.CPU) == DeviceType.CPU


def _is_label(name: str) -> bool:
    return name.startswith(_MODULE_PREFIX) or name == _ROOT_LABEL


def _context(evt: Any) -> tuple[list[str], list[str]]:
    """(op stack innermost first, module labels innermost first) of a CPU event, itself included."""
    ops: list[str] = []
    mods: list[str] = []
    cur = evt
    depth = 0
    while cur is not None and depth < 256:
        name = cur.name
        if name == _ROOT_LABEL:
            break
        if name.startswith(_MODULE_PREFIX):
            mods.append(name)
        else:
            ops.append(name)
        cur = getattr(cur, "cpu_parent", None)
        depth += 1
    return ops, mods


def _union_us(intervals: Iterable[tuple[float, float]]) -> float:
    total = 0.0
    cur_s: float | None = None
    cur_e = 0.0
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if cur_s is None or s > cur_e:
            if cur_s is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_s is not None:
        total += cur_e - cur_s
    return total


def _short(name: str, limit: int = 160) -> str:
    name = " ".join(str(name).split())
    return name if len(name) <= limit else name[: limit - 3] + "..."


# a compiled graph's call on the host: its own time (children apart) is the
# code inductor generated, fused pointwise / reduction loops (the host-side
# twin of a "triton_poi_fused_..." kernel); its library calls (aten::mm, ...)
# are its children and counted on their own
_COMPILED_GRAPH_RE = re.compile(r"^## call compiledfxgraph", re.I)


def _self_category(name: str) -> str:
    """The category of an unnamed op's own time (children apart)."""
    return "elementwise" if _COMPILED_GRAPH_RE.search(str(name)) else "other"


def _host_units(root: Any) -> list[tuple[str, str, float]]:
    """(name, category, microseconds) for the host time under ``root``: each
    top-level op with its inclusive time; an op no pattern names (a compiled
    region, a custom op) is opened up: its children are counted on their own
    and only its self time stays 'other' (a compiled graph's own time is
    inductor's fused code: elementwise). Module labels are transparent."""
    out: list[tuple[str, str, float]] = []

    def visit(evt: Any) -> None:
        for child in getattr(evt, "cpu_children", None) or []:
            if getattr(child, "is_async", False):
                continue
            name = child.name
            if _is_label(name):
                visit(child)
                continue
            ops, mods = _context(child)
            cat = attribute(None, ops, mods)
            kids = [k for k in (getattr(child, "cpu_children", None) or []) if not getattr(k, "is_async", False)]
            if cat == "other" and kids:
                inner = sum(_dur_us(k) for k in kids)
                out.append((name, _self_category(name), max(0.0, _dur_us(child) - inner)))
                visit(child)
            else:
                out.append((name, cat, _dur_us(child)))

    visit(root)
    return out


_SYNC_RE = re.compile(r"\b(stream|context|event|device)\s*(sync|synchronize|wait)", re.I)


def _is_device_work(evt: Any, annotation_names: set[str]) -> bool:
    """A device event that is a kernel, memcpy or memset: not a mirrored user
    annotation (record_function labels appear on the GPU timeline too) and
    not a synchronization record (a wait, not work)."""
    if getattr(evt, "is_user_annotation", False):
        return False
    name = evt.name
    if name in annotation_names or _is_label(name):
        return False
    act = str(getattr(evt, "activity_type", None) or "").lower()
    if "annotation" in act or "sync" in act:
        return False
    return not _SYNC_RE.search(name)


def _device_units(
    events: Sequence[Any], window: tuple[float, float]
) -> tuple[list[tuple[str, str, float]], float]:
    """(kernel name, category, microseconds clipped to the window) for each
    device kernel, and the union of their intervals in the window (busy time).

    A kernel is tied to the op that launched it by its
    ``linked_correlation_id`` (the id of that frontend op, as torch itself
    uses to fill ``FunctionEvent.kernels``); without it (an older torch, a
    CUDA-graph replay) the kernel is categorized by its name alone."""
    ops_by_id: dict[int, Any] = {}
    annotation_names: set[str] = set()
    for e in events:
        if not _is_cpu(e) or getattr(e, "is_async", False):
            continue
        if getattr(e, "is_user_annotation", False):
            annotation_names.add(e.name)
        if int(getattr(e, "linked_correlation_id", 0) or 0) == 0:  # a frontend op, not a runtime call
            ops_by_id.setdefault(int(getattr(e, "id", -1)), e)
    w0, w1 = window
    units: list[tuple[str, str, float]] = []
    intervals: list[tuple[float, float]] = []
    for e in events:
        if _is_cpu(e) or not _is_device_work(e, annotation_names):
            continue
        s, t = max(float(e.time_range.start), w0), min(float(e.time_range.end), w1)
        if t <= s:
            continue
        intervals.append((s, t))
        corr = int(getattr(e, "linked_correlation_id", 0) or 0)
        op = ops_by_id.get(corr) if corr > 0 else None
        ops, mods = _context(op) if op is not None else ([], [])
        units.append((e.name, attribute(e.name, ops, mods), t - s))
    return units, _union_us(intervals)


def _summarize(
    units: list[tuple[str, str, float]], wall_us: float, busy_us: float, top_n: int
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    raw: dict[str, float] = defaultdict(float)
    for _, cat, us in units:
        raw[cat] += us
    raw_total = sum(raw.values())
    busy_us = min(busy_us, wall_us) if wall_us > 0 else busy_us
    # overlapping kernels (several streams) can sum past the busy union:
    # categories share the busy time in proportion to their raw time
    scale = (busy_us / raw_total) if raw_total > 0 else 0.0
    idle_us = max(0.0, wall_us - busy_us)
    cats: dict[str, dict[str, Any]] = {}
    for cat in CATEGORIES:
        attributed = idle_us if cat == "idle" else raw.get(cat, 0.0) * scale
        cats[cat] = {
            "label": CATEGORY_LABELS[cat],
            "seconds": attributed / 1e6,
            "raw_seconds": (idle_us if cat == "idle" else raw.get(cat, 0.0)) / 1e6,
            "share": (attributed / wall_us) if wall_us > 0 else 0.0,
        }
    agg: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for name, cat, us in units:
        a = agg[(name, cat)]
        a[0] += us
        a[1] += 1
    top = sorted(agg.items(), key=lambda kv: -kv[1][0])[: max(0, int(top_n))]
    top_ops = [
        {
            "name": _short(name),
            "category": cat,
            "seconds": us / 1e6,
            "share": (us * scale / wall_us) if wall_us > 0 else 0.0,
            "count": int(n),
        }
        for (name, cat), (us, n) in top
    ]
    return cats, top_ops


# ----------------------------------------------------------------- entry
def profile_run(adapter: Any, handle: Any, seed: int, *, top_n: int = 15) -> dict[str, Any]:
    """One extra, untimed ``adapter.run(handle, seed)`` under torch.profiler;
    returns the category breakdown (JSON-able).

    Keys: ``device``, ``activities``, ``torch_version``, ``profiler``,
    ``seed``, ``config_id``, ``wall_s`` (profiled wall of the run),
    ``device_busy_s`` (union of kernel intervals on CUDA; time covered by
    top-level ops on CPU), ``busy_basis``, ``categories`` (per category:
    ``label``, ``seconds``, ``raw_seconds``, ``share``; shares sum to 1),
    ``shares_sum``, ``top_ops`` (top ``top_n`` kernels on CUDA / top-level ops
    on CPU, each with its category, seconds, share and count),
    ``module_labels`` (whether norm / attention modules were labelled), ``run``
    (the profiled run's success, tokens, wall and error; not a measurement),
    ``notes``.
    """
    import torch
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity

    device = str(getattr(handle, "device", None) or getattr(adapter, "device", None) or "cpu")
    on_cuda = device.startswith("cuda") and torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    notes: list[str] = ["profiled run: overhead inflates absolute times; shares are the result; not a timed measurement"]
    compiled = _is_compiled(handle)
    model = None if compiled else getattr(handle, "model", None)
    if compiled:
        notes.append("compiled configuration: no module labels (hooks would recompile); kernels categorized by name")

    rec: Any = None
    if on_cuda:
        torch.cuda.synchronize()
    with _module_labels(model) as labelled:
        with torch.profiler.profile(activities=activities, record_shapes=False, with_stack=False) as prof:
            with record_function(_ROOT_LABEL):
                t0 = time.perf_counter()
                try:
                    rec = adapter.run(handle, seed)
                finally:
                    if on_cuda:
                        torch.cuda.synchronize()
                    host_wall = time.perf_counter() - t0
    events = list(prof.events())
    roots = [e for e in events if e.name == _ROOT_LABEL and _is_cpu(e)]
    if roots:
        root = max(roots, key=_dur_us)
        window = (float(root.time_range.start), float(root.time_range.end))
        wall_us = _dur_us(root)
    else:  # pragma: no cover - the label is always recorded
        root = None
        window = (float("-inf"), float("inf"))
        wall_us = host_wall * 1e6
        notes.append("root label missing: wall from the host clock")

    if on_cuda:
        units, busy_us = _device_units(events, window)
        basis = "device kernels (union of kernel intervals)"
    else:
        units = _host_units(root) if root is not None else []
        busy_us = sum(us for _, _, us in units)
        basis = "host top-level ops"
    cats, top_ops = _summarize(units, wall_us, busy_us, top_n)
    shares_sum = sum(c["share"] for c in cats.values())

    run_info = {
        "success": bool(getattr(rec, "success", False)),
        "error": getattr(rec, "error", None),
        "wall_s": float(getattr(rec, "wall_s", 0.0) or 0.0),
        "output_tokens": int(getattr(rec, "output_tokens", 0) or 0),
        "expected_output_tokens": int(getattr(rec, "expected_output_tokens", 0) or 0),
    }
    dev_name = None
    if on_cuda:
        with contextlib.suppress(Exception):
            dev_name = torch.cuda.get_device_name(torch.device(device))
    return {
        "schema": 1,
        "device": "cuda" if on_cuda else "cpu",
        "device_name": dev_name,
        "activities": ["cpu", "cuda"] if on_cuda else ["cpu"],
        "torch_version": torch.__version__,
        "profiler": "torch.profiler (kineto)",
        "seed": int(seed),
        "config_id": getattr(handle, "config_id", None),
        "wall_s": wall_us / 1e6,
        "host_wall_s": host_wall,
        "device_busy_s": min(busy_us, wall_us) / 1e6,
        "busy_basis": basis,
        "categories": cats,
        "shares_sum": shares_sum,
        "dominant": max((c for c in CATEGORIES), key=lambda c: cats[c]["share"]),
        "top_ops": top_ops,
        "units": len(units),
        "module_labels": bool(labelled),
        "run": run_info,
        "notes": notes,
    }


def profile_config(adapter: Any, config: Mapping[str, Any], *, warm_seed: int = 7, seed: int = 8) -> dict[str, Any]:
    """Prepare ``config``, run it once untimed (compilation, CUDA-graph capture
    and first-call costs stay out of the profile), then :func:`profile_run`
    one more run; the handle is released either way."""
    h = adapter.prepare(dict(config))
    try:
        adapter.run(h, warm_seed)
        return profile_run(adapter, h, seed)
    finally:
        adapter.release(h)
