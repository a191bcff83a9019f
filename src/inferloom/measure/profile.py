"""Profile one run: where the time of a configuration goes, by category.

:func:`profile_run` performs **one extra, untimed** run of an adapter under
``torch.profiler`` (CPU activities, plus CUDA when the configuration runs on a
CUDA device) and groups the time into the categories of
:mod:`inferloom.measure.op_categories` (``gemm``, ``attention``,
``normalization``, ``elementwise``, ``memory_copy``, ``communication``,
``other``, ``idle``) through :mod:`inferloom.measure.trace_analysis`.
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
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator, Mapping

from inferloom.measure.op_categories import CATEGORIES, categorize
from inferloom.measure.trace_analysis import (
    MODULE_PREFIX,
    ROOT_LABEL,
    device_units,
    dur_us,
    host_units,
    is_cpu,
    summarize,
)

__all__ = ["profile_run", "profile_config"]

# Module classes whose forward gets a record_function label while profiling.
_SCOPE_CATEGORIES = frozenset({"normalization", "attention"})


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
            label = MODULE_PREFIX + type(mod).__name__
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
            with record_function(ROOT_LABEL):
                t0 = time.perf_counter()
                try:
                    rec = adapter.run(handle, seed)
                finally:
                    if on_cuda:
                        torch.cuda.synchronize()
                    host_wall = time.perf_counter() - t0
    events = list(prof.events())
    roots = [e for e in events if e.name == ROOT_LABEL and is_cpu(e)]
    if roots:
        root = max(roots, key=dur_us)
        window = (float(root.time_range.start), float(root.time_range.end))
        wall_us = dur_us(root)
    else:  # pragma: no cover - the label is always recorded
        root = None
        window = (float("-inf"), float("inf"))
        wall_us = host_wall * 1e6
        notes.append("root label missing: wall from the host clock")

    if on_cuda:
        units, busy_us = device_units(events, window)
        basis = "device kernels (union of kernel intervals)"
    else:
        units = host_units(root) if root is not None else []
        busy_us = sum(us for _, _, us in units)
        basis = "host top-level ops"
    cats, top_ops = summarize(units, wall_us, busy_us, top_n)
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
