"""What a server's own log says it JIT-compiled while a timed run was under way.

vLLM (0.26 on) watches Triton, CuTe DSL and TileLang compiles after its warm-up and logs each as
``Triton kernel JIT compilation during inference: fused_moe_kernel. This causes a latency spike; ...``
(``vllm/utils/jit_monitor.py``; once per kernel and server unless it runs with ``--jit-monitor-verbose``,
which logs every one). A run that paid for a compile measured the compile too: on one H100 (2026-12-05,
docs/benchmarks.md section 26) two candidate runs came out 19-25% slow beside a server whose log had said
so once. :func:`log_offset` before the timed requests and :func:`jit_events` after them give the kernels
compiled meanwhile; ``serving_run`` records them as ``extra['server_jit']``, the pair's progress line says
so, and the report lists such runs (``report/server_jit.py``). A compile is warm-up (Triton caches the kernel
on disk; a deployed server pays it once): the protocol measures such a pair again, on fresh prompts, instead
of deciding on it, at most ``protocol.jit_remeasures`` times per comparison, then counts it like any other
(``measure/protocol.py``'s contract; ``measure/protocol_remeasure.py``). The log line alone decides, never
the run's value; the voided pairs stay in the record (``remeasured``), with their raw records. On 2026-12-06
one such pair (a candidate at 7,201 tok/s beside 8,191, the next two pairs +0.7% and +0.9%) had reverted a
trial for futility on its own.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["JIT_LINE", "log_offset", "jit_events"]

#: the monitor's line: ``<backend> <event> during inference: <kernel>[ (detail)]. This causes a latency spike``
JIT_LINE = re.compile(r"(?P<what>JIT compilation|autotuning[\w ]*|compilation) during inference: "
                      r"(?P<kernel>[A-Za-z_]\w*(?:\.\w+)*)[^\n]*?latency spike")
MAX_READ = 8 << 20  # a run's share of a log: enough for any run's lines, bounded for a runaway log


def log_offset(path: str | Path) -> int:
    """The log's size now (0 when it is not there yet)."""
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0


def jit_events(path: str | Path, since: int) -> list[str]:
    """The kernels the log says were compiled during inference after byte ``since`` (in order, repeats
    kept: each line is one compile)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, int(since)))
            text = f.read(MAX_READ).decode("utf-8", errors="replace")
    except OSError:
        return []
    return [m.group("kernel") for m in JIT_LINE.finditer(text)]
