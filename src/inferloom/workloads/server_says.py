"""What a server's own log says it runs: the values its defaults resolved to, as knob values.

A knob left at ``default`` (or a bool knob off) lets the server decide, and the server decides by itself more
than its flags say: vLLM 0.26.0 turns asynchronous scheduling on and captures ``FULL_AND_PIECEWISE`` CUDA
graphs by default on an H200 (its stock log: ``Asynchronous scheduling is enabled.``, ``'cudagraph_mode':
<CUDAGraphMode.FULL_AND_PIECEWISE``). A candidate that sets a knob to the value stock already runs starts the
same server as stock: every H200 vLLM session before this measured ``async_scheduling=True`` and
``cudagraph_mode=FULL_AND_PIECEWISE`` as trials (two of six in a 20-minute session: 216 s of noise, and a
"+5.4%, reverted" that was an A/A).

Each engine reads its log (``StartHooks.says``: knob -> ``(raw value, the line that says it)``); here the raw
values become knob values (:func:`knob_values`), kept only where they differ from the knob's default (what
inferloom would otherwise believe stock runs). The session keeps stock's (``extra.stock_runs``) and the
orchestrator never proposes a change to a value stock already runs (``agents/search_view.redundant``).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from inferloom.workloads.base import Knob

__all__ = ["Says", "nothing_said", "knob_value", "knob_values", "first_match"]

#: knob -> (raw value, the log line that says it)
Says = dict[str, tuple[Any, str]]

_TRUE = {"true", "enabled", "on", "1"}
_FALSE = {"false", "disabled", "off", "0", "none"}


def nothing_said(_log_text: str) -> Says:
    """An engine that reads nothing from its log."""
    return {}


def first_match(log_text: str, patterns: Iterable[tuple[str, Any, Callable[[Any], Any]]]) -> Says:
    """For each ``(knob, compiled regex, convert)``: ``convert(match)`` of the regex's first match and its line
    (trimmed to 200 characters), for the knobs whose regex matches."""
    out: Says = {}
    for knob, rx, convert in patterns:
        m = rx.search(log_text)
        if m and knob not in out:
            start = log_text.rfind("\n", 0, m.start()) + 1
            end = log_text.find("\n", m.end())
            line = log_text[start:end if end >= 0 else len(log_text)].strip()
            if len(line) > 200:  # a long configuration line: the matched part and a little around it
                a = max(m.start() - start - 40, 0)
                line = "..." + line[a:a + 160] + "..."
            out[knob] = (convert(m), line)
    return out


def knob_value(knob: Knob, raw: Any) -> Any:
    """``raw`` (what the log says) as a value of ``knob``, or None when it is none of the knob's values."""
    s = str(raw).strip().strip("'\"")
    if knob.kind == "bool":
        return True if s.lower() in _TRUE else False if s.lower() in _FALSE else None
    if knob.kind == "int":
        try:
            v = int(float(s))
        except (ValueError, OverflowError):
            return None
        return v if (knob.low is None or v >= knob.low) and (knob.high is None or v <= knob.high) else None
    for c in knob.choices or ():
        if str(c) == s or str(c).lower() == s.lower():
            return c
        try:
            if float(str(c)) == float(s):
                return c
        except ValueError:
            pass
    return None


def knob_values(says: Mapping[str, tuple[Any, str]], knobs: Iterable[Knob]) -> dict[str, dict[str, Any]]:
    """The knobs ``says`` names whose value differs from the knob's default: ``{knob: {"value", "said"}}``."""
    by = {k.name: k for k in knobs}
    out: dict[str, dict[str, Any]] = {}
    for name, (raw, line) in says.items():
        k = by.get(name)
        v = knob_value(k, raw) if k is not None else None
        if v is not None and v != k.default:
            out[name] = {"value": v, "said": line}
    return out
