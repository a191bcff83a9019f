"""From torch.profiler events to category shares: the analysis half of a profile.

:func:`host_units` (CPU: top-level ops under the profiled run's root label)
and :func:`device_units` (CUDA: kernels, tied to the op that launched them)
turn a trace into units of work, each with a category
(:func:`inferloom.measure.op_categories.attribute`); :func:`summarize` turns
the units into per-category seconds and shares (summing to 1 with ``idle``)
and the top ops. :mod:`inferloom.measure.profile` captures the trace.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any, Iterable, Sequence

from inferloom.measure.op_categories import CATEGORIES, CATEGORY_LABELS, attribute

__all__ = ["MODULE_PREFIX", "ROOT_LABEL", "dur_us", "is_cpu", "host_units", "device_units", "summarize", "union_us"]

MODULE_PREFIX = "module::"  # record_function label of a module's forward while profiling
ROOT_LABEL = "inferloom::profile_run"  # record_function label around the profiled run


def dur_us(evt: Any) -> float:
    tr = evt.time_range
    return float(tr.end - tr.start)


def is_cpu(evt: Any) -> bool:
    from torch.autograd import DeviceType

    return getattr(evt, "device_type", DeviceType.CPU) == DeviceType.CPU


def _is_label(name: str) -> bool:
    return name.startswith(MODULE_PREFIX) or name == ROOT_LABEL


def _context(evt: Any) -> tuple[list[str], list[str]]:
    """(op stack innermost first, module labels innermost first) of a CPU event, itself included."""
    ops: list[str] = []
    mods: list[str] = []
    cur = evt
    depth = 0
    while cur is not None and depth < 256:
        name = cur.name
        if name == ROOT_LABEL:
            break
        if name.startswith(MODULE_PREFIX):
            mods.append(name)
        else:
            ops.append(name)
        cur = getattr(cur, "cpu_parent", None)
        depth += 1
    return ops, mods


def union_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals (empty or reversed ones ignored), in their unit."""
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


def host_units(root: Any) -> list[tuple[str, str, float]]:
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
                inner = sum(dur_us(k) for k in kids)
                out.append((name, _self_category(name), max(0.0, dur_us(child) - inner)))
                visit(child)
            else:
                out.append((name, cat, dur_us(child)))

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


def device_units(
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
        if not is_cpu(e) or getattr(e, "is_async", False):
            continue
        if getattr(e, "is_user_annotation", False):
            annotation_names.add(e.name)
        if int(getattr(e, "linked_correlation_id", 0) or 0) == 0:  # a frontend op, not a runtime call
            ops_by_id.setdefault(int(getattr(e, "id", -1)), e)
    w0, w1 = window
    units: list[tuple[str, str, float]] = []
    intervals: list[tuple[float, float]] = []
    for e in events:
        if is_cpu(e) or not _is_device_work(e, annotation_names):
            continue
        s, t = max(float(e.time_range.start), w0), min(float(e.time_range.end), w1)
        if t <= s:
            continue
        intervals.append((s, t))
        corr = int(getattr(e, "linked_correlation_id", 0) or 0)
        op = ops_by_id.get(corr) if corr > 0 else None
        ops, mods = _context(op) if op is not None else ([], [])
        units.append((e.name, attribute(e.name, ops, mods), t - s))
    return units, union_us(intervals)


def summarize(
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

