"""Where an SGLang server's start-up went, read from its own log.

The lines come from SGLang 0.5.17's source (the PyPI wheel, read on CPU) and were
seen in a real start's log on the H200 (2026-12-05, tests/data/sglang/): every logger line
starts ``[YYYY-MM-DD HH:MM:SS(.mmm)( TP0)] `` (``utils/common.configure_logger``;
milliseconds with ``SGLANG_LOG_MS=1``, which ``sglang_launch`` sets), and
it states: ``Load weight begin.`` / ``Load weight end. elapsed=X s``
(``model_runner``), ``Memory pool end.`` (``kv_cache_configurator``),
``Capture <role> <decode|prefill|verify> CUDA graph begin.`` / ``... end.
elapsed=X s`` (``cuda_graph_setup``), ``The server is fired up and ready to
roll!`` (``http_server``, after its warm-up request).

:func:`startup_split` turns that into non-overlapping parts that sum to the
measured start-up (seconds; a part is absent when its line is):

* ``before_first_log``: launch to the first timestamped line (imports);
* ``processes``: the first line to ``Load weight begin`` (tokenizer manager,
  scheduler processes, torch distributed);
* ``weights``: ``Load weight end``'s stated ``elapsed``;
* ``kv_cache``: the end of weight loading to ``Memory pool end`` (profiling, the KV pool);
* ``cuda_graphs``: the stated ``elapsed`` of every graph capture (torch.compile runs inside it);
* ``warmup``: the last of those to ``fired up`` (attention backends, the warm-up request);
* ``other``: what is left (the health poll, the HTTP server).

Pure; ``sglang_servers`` records it with each start.
"""

from __future__ import annotations

import datetime as _dt
import re
from typing import Any

from inferloom.workloads.server_says import first_match

__all__ = ["PARTS", "startup_split", "split_text", "says"]

PARTS = ("before_first_log", "processes", "weights", "kv_cache", "cuda_graphs", "warmup", "other")

_TS = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(\.\d+)?(?: [^\]]*)?\] ")
_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_WEIGHT_BEGIN = re.compile(r"Load weight begin\.")
_WEIGHT_END = re.compile(r"Load weight end\. elapsed=" + _NUM + r" s")
_POOL_END = re.compile(r"Memory pool end\.")
_GRAPH_END = re.compile(r"Capture [\w ]*?CUDA graph end\. elapsed=" + _NUM + r" s")
_READY = re.compile(r"The server is fired up and ready to roll!")


def _ts(line: str) -> float | None:
    m = _TS.match(line)
    if not m:
        return None
    t = _dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
    return t + (float(m.group(2)) if m.group(2) else 0.0)


def startup_split(log_text: str, startup_s: float) -> dict[str, Any]:
    """``{"parts": {part: seconds}, "stated": {...}}`` for one start of ``startup_s`` seconds; the parts
    present sum to ``startup_s`` (``other`` takes the rest). A log without SGLang's lines gives
    ``{"parts": {"other": startup_s}}``."""
    stamps = [(t, line) for line in log_text.splitlines() if (t := _ts(line)) is not None]

    def first(p: re.Pattern[str]) -> tuple[float, re.Match[str]] | None:
        return next(((t, m) for t, line in stamps if (m := p.search(line))), None)

    graphs = [(t, float(m.group(1))) for t, line in stamps if (m := _GRAPH_END.search(line))]
    w_end, pool, ready = first(_WEIGHT_END), first(_POOL_END), first(_READY)
    stated: dict[str, float] = {}
    if w_end:
        stated["load_weight"] = float(w_end[1].group(1))
    if graphs:
        stated["cuda_graphs"] = sum(s for _, s in graphs)
    parts: dict[str, float] = {}
    if stamps:
        t0 = stamps[0][0]
        t_ready = ready[0] if ready else stamps[-1][0]
        parts["before_first_log"] = max(0.0, startup_s - max(0.0, t_ready - t0))
        begin = first(_WEIGHT_BEGIN)
        if begin:
            parts["processes"] = max(0.0, begin[0] - t0)
        if w_end:
            parts["weights"] = stated["load_weight"]
            if pool:
                parts["kv_cache"] = max(0.0, pool[0] - w_end[0])
        if graphs:
            parts["cuda_graphs"] = stated["cuda_graphs"]
        last = graphs[-1][0] if graphs else (pool[0] if pool else None)
        if ready and last is not None:
            parts["warmup"] = max(0.0, ready[0] - last)
    known = sum(parts.values())
    for est in ("before_first_log", "processes", "kv_cache", "warmup"):  # timestamp estimates are trimmed first,
        if known > startup_s and est in parts:                          # never the parts SGLang states
            cut = min(parts[est], known - startup_s)
            parts[est] -= cut
            known -= cut
    parts["other"] = max(0.0, startup_s - known)
    return {"parts": {k: round(parts[k], 3) for k in PARTS if k in parts}, "stated": stated}


def split_text(parts: dict[str, float]) -> str:
    """``"before first log 12 s, weights 5 s, ..."`` (the parts present, in order)."""
    return ", ".join(f"{k.replace('_', ' ')} {parts[k]:.0f} s" for k in PARTS if k in parts)


#: SGLang logs its whole configuration once (``server_args=ServerArgs(...)``, 0.5.17): the fields a knob names
_ARGS = re.compile(r"server_args=ServerArgs\(.*")
_FIELD = r"\b{}=(?:'([^']*)'|([^,\s)]+))"
_SAYS_FIELDS = {"attention_backend": "attention_backend", "chunked_prefill_size": "chunked_prefill_size",
                "cuda_graph_max_bs": "cuda_graph_max_bs_decode", "schedule_policy": "schedule_policy",
                "schedule_conservativeness": "schedule_conservativeness", "kv_cache_dtype": "kv_cache_dtype",
                "enable_torch_compile": "enable_torch_compile", "enable_mixed_chunk": "enable_mixed_chunk",
                "disable_overlap_schedule": "disable_overlap_schedule"}


def says(log_text: str) -> dict[str, tuple[Any, str]]:
    """What the server's log says it runs (``server_says``): knob -> (raw value, its line), from the
    ``ServerArgs`` line (``None`` fields: nothing said)."""
    m = _ARGS.search(log_text)
    if not m:
        return {}
    line = m.group(0)
    pats = [(k, re.compile(_FIELD.format(re.escape(f))), lambda x: x.group(1) if x.group(1) is not None else x.group(2))
            for k, f in _SAYS_FIELDS.items()]
    pats.append(("prefix_caching", re.compile(r"\bdisable_radix_cache=(True|False)"),
                 lambda x: "off" if x.group(1) == "True" else "default"))
    return {k: v for k, v in first_match(line, pats).items() if v[0] not in (None, "None")}
