"""A server's own profiler trace (vLLM's ``/start_profile`` .. ``/stop_profile``,
torch.profiler's Chrome-trace JSON, gzipped or not) as category shares.

* :func:`load_events`: the ``traceEvents`` of one trace file.
* :func:`trace_profile`: on a GPU trace, every device kernel (``cat`` kernel,
  gpu_memcpy, gpu_memset) is a unit of work, categorised by its name
  (:func:`~inferloom.measure.op_categories.categorize`); ``idle`` is the time
  between the first kernel's start and the last one's end that no kernel ran
  (launch gaps, scheduling, host work). A trace without kernels (a CPU server)
  falls back to the top-level ``cpu_op`` events of each thread (ops nested in
  another op count inside it). Shares come from
  :func:`~inferloom.measure.trace_analysis.summarize`, as for an in-process
  profile, so reports read both the same way.

Pure functions of the events; the capture is ``workloads/vllm_profile.py``.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping

from inferloom.measure.op_categories import categorize
from inferloom.measure.trace_analysis import summarize, union_us

__all__ = ["DEVICE_CATS", "load_events", "trace_profile"]

#: Chrome-trace categories of device work
DEVICE_CATS = {"kernel": None, "gpu_memcpy": "memory_copy", "gpu_memset": "memory_copy"}


def load_events(path: str | Path) -> list[dict[str, Any]]:
    """The ``traceEvents`` of a torch.profiler Chrome trace (``.json`` or ``.json.gz``)."""
    p = Path(path)
    opener = gzip.open if p.name.endswith(".gz") else open
    try:
        with opener(p, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError, EOFError) as exc:
        raise ValueError(f"trace {p}: not a readable Chrome trace ({exc})") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"trace {p}: no traceEvents list")
    return [e for e in events if isinstance(e, dict)]


def _span(e: Mapping[str, Any]) -> tuple[float, float] | None:
    try:
        ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
    except (KeyError, TypeError, ValueError):
        return None
    return (ts, ts + dur) if dur >= 0 else None


def _top_level_cpu_ops(events: list[Mapping[str, Any]]) -> list[tuple[str, float, float]]:
    by_thread: dict[tuple[Any, Any], list[tuple[float, float, str]]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op" and e.get("ph", "X") == "X":
            s = _span(e)
            if s is not None:
                by_thread[(e.get("pid"), e.get("tid"))].append((s[0], -s[1], str(e.get("name", ""))))
    out: list[tuple[str, float, float]] = []
    for ops in by_thread.values():
        end = float("-inf")
        for a, neg_b, name in sorted(ops):  # outer op first when two start together
            if a >= end:
                out.append((name, a, -neg_b))
                end = -neg_b
    return out


def trace_profile(events: list[Mapping[str, Any]], top_n: int = 15) -> dict[str, Any]:
    """Category shares of one trace (see the module docstring). Raises
    ValueError when the trace holds neither kernels nor CPU ops."""
    units: list[tuple[str, str, float]] = []
    spans: list[tuple[float, float]] = []
    for e in events:
        cat = e.get("cat")
        if cat in DEVICE_CATS and e.get("ph", "X") == "X":
            s = _span(e)
            if s is None:
                continue
            name = str(e.get("name", ""))
            units.append((name, DEVICE_CATS[cat] or categorize(name), s[1] - s[0]))
            spans.append(s)
    source = "device kernels"
    if not units:
        source = "top-level CPU ops (no device kernels in the trace)"
        for name, a, b in _top_level_cpu_ops(list(events)):
            units.append((name, categorize(name), b - a))
            spans.append((a, b))
    if not units:
        raise ValueError("the trace holds no device kernels and no CPU ops: nothing to attribute")
    wall = max(b for _, b in spans) - min(a for a, _ in spans)
    busy = union_us(spans)
    cats, top = summarize(units, wall, busy, top_n)
    return {"source": source, "units": len(units), "wall_s": wall / 1e6, "busy_s": busy / 1e6,
            "categories": cats, "top_ops": top}
