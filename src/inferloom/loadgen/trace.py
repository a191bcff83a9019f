"""Request traces: a recorded arrival pattern and per-request lengths, replayed by the load generator.

A trace is a file of requests, each with an arrival time and its lengths (``traffic.trace``;
docs/loadgen.md, "Traces"). Three shapes are read, one per file:

* **Mooncake** (JSONL): ``{"timestamp": <ms>, "input_length": N, "output_length": M, ...}``; other keys
  (``hash_ids``) are ignored.
* **inferloom** (JSONL): ``{"arrival_s": <s>, "input_len": N, "output_len": M}``, or ``"text": "..."``
  instead of ``input_len`` (the text is tokenized by the caller's ``tokenize``: the model's own tokenizer,
  and its token count is the request's input length).
* **Azure** LLM inference trace (CSV, ``.csv``): ``TIMESTAMP,ContextTokens,GeneratedTokens`` with
  timestamps as datetimes (``2023-11-16 18:15:46.6805900``).

:func:`load_trace` validates and normalises: arrivals sorted (stable: ties keep the file's order),
rebased to the first request (which arrives at 0) and divided by ``time_scale`` (2.0 replays twice as
fast). Refused, one line (:class:`TraceError`, exit 2): a missing or empty file, a malformed line (its
number named), a negative or non-finite time, a length below 1, ``input + output`` over the model's
context, a file mixing shapes, texts without a tokenizer.

:meth:`Trace.window` is the window rule: run ``seed`` replays ``n`` consecutive requests of the trace,
window ``seed mod W`` of the ``W = len // n`` disjoint windows (the remainder, fewer than ``n`` requests
at the end, is never replayed), its arrivals rebased to the window's first request. Both arms of a pair
run on one seed, so they replay the same window (the same arrivals and lengths); the pairs of a
comparison run on consecutive seeds, so they replay consecutive windows, wrapping after ``W``.

Pure: no clocks, no torch; reads the one file it is given.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Sequence

from inferloom.errors import InferloomError

__all__ = ["TraceError", "TraceRequest", "Trace", "TraceWindow", "load_trace", "parse_trace", "model_context"]

#: the largest trace read (requests); the spec's num_prompts bound is 100,000 per run
MAX_REQUESTS = 1_000_000


class TraceError(InferloomError, ValueError):
    """A trace is unusable; the message is one line saying where and why."""


@dataclass(frozen=True)
class TraceRequest:
    """One request: ``arrival_s`` after the trace's first (scaled), its lengths, its text's ids if any."""

    arrival_s: float
    input_len: int
    output_len: int
    line: int
    ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class TraceWindow:
    """The requests one run replays, arrivals rebased to the window's first request."""

    index: int
    start: int
    requests: tuple[TraceRequest, ...]
    windows: int

    @property
    def arrivals(self) -> list[float]:
        t0 = self.requests[0].arrival_s
        return [r.arrival_s - t0 for r in self.requests]

    @property
    def input_lens(self) -> list[int]:
        return [r.input_len for r in self.requests]

    @property
    def output_lens(self) -> list[int]:
        return [r.output_len for r in self.requests]


@dataclass(frozen=True)
class Trace:
    path: str
    sha256: str
    shape: str  # "mooncake" | "inferloom" | "azure"
    time_scale: float
    requests: tuple[TraceRequest, ...]

    def __len__(self) -> int:
        return len(self.requests)

    def windows(self, n: int) -> int:
        return max(1, len(self.requests) // n) if n >= 1 else 0

    def window(self, seed: int, n: int) -> TraceWindow:
        """Run ``seed``'s ``n`` requests (the module docstring's rule)."""
        if not 1 <= n <= len(self.requests):
            raise TraceError(f"trace '{self.path}': a run of {n} requests needs 1 to {len(self.requests)} "
                             "(the trace's requests); set traffic.num_prompts within them")
        w = self.windows(n)
        k = int(seed) % w
        return TraceWindow(index=k, start=k * n, requests=self.requests[k * n:(k + 1) * n], windows=w)

    def state(self, window: TraceWindow) -> dict[str, Any]:
        """What a run records of its trace (the serving result's ``trace``)."""
        return {"file": self.path, "sha256": self.sha256, "shape": self.shape, "requests": len(self.requests),
                "time_scale": self.time_scale, "window_index": window.index, "window_start": window.start,
                "window_len": len(window.requests), "windows": window.windows,
                "window_span_s": window.arrivals[-1]}


def model_context(model_dir: str | Path | None, max_model_len: int | None = None) -> int | None:
    """The context a request must fit: ``max_model_len`` when set, else the model directory's
    ``config.json`` ``max_position_embeddings`` (None when neither is known)."""
    if max_model_len:
        return int(max_model_len)
    if model_dir is None:
        return None
    cfg = Path(model_dir) / "config.json"
    try:
        data = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return None
    v = data.get("max_position_embeddings") or (data.get("text_config") or {}).get("max_position_embeddings")
    return int(v) if isinstance(v, int) and v > 0 else None


def _int(obj: dict[str, Any], key: str, where: str) -> int:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v):
        raise TraceError(f"{where}: \"{key}\" must be an integer, got {v!r}")
    if v < 1:
        raise TraceError(f"{where}: \"{key}\" {int(v)} is below 1; every request needs at least one token")
    return int(v)


def _time(v: Any, key: str, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise TraceError(f"{where}: \"{key}\" must be a finite number, got {v!r}")
    if v < 0:
        raise TraceError(f"{where}: \"{key}\" {v!r} is negative; arrival times are 0 or later")
    return float(v)


def _json_line(obj: Any, where: str) -> tuple[str, float, int | None, int, str | None]:
    """(shape, time in s, input_len or None for a text, output_len, text)."""
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "timestamp" in obj:
        return ("mooncake", _time(obj["timestamp"], "timestamp", where) / 1000.0,
                _int(obj, "input_length", where), _int(obj, "output_length", where), None)
    if "arrival_s" in obj:
        t = _time(obj["arrival_s"], "arrival_s", where)
        out = _int(obj, "output_len", where)
        if "text" in obj:
            if "input_len" in obj:
                raise TraceError(f"{where}: give \"input_len\" or \"text\", not both")
            if not isinstance(obj["text"], str) or not obj["text"].strip():
                raise TraceError(f"{where}: \"text\" must be a non-empty string")
            return "inferloom", t, None, out, obj["text"]
        return "inferloom", t, _int(obj, "input_len", where), out, None
    raise TraceError(f"{where}: no arrival time; expected {{\"timestamp\": ms, \"input_length\", \"output_length\"}} "
                     "(Mooncake) or {\"arrival_s\": s, \"input_len\" or \"text\", \"output_len\"} (inferloom)")


def _parse_jsonl(text: str, path: str) -> list[tuple[str, float, int | None, int, str | None, int]]:
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"trace '{path}': line {lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where} is not valid JSON ({exc.msg})") from None
        rows.append((*_json_line(obj, where), lineno))
    return rows


def _azure_time(v: str, where: str) -> float:
    s = v.strip().replace("T", " ")
    if "." in s:  # the published trace has 7 fractional digits; datetime reads at most 6
        head, frac = s.split(".", 1)
        digits = "".join(c for c in frac if c.isdigit())
        s = f"{head}.{digits[:6]}{frac[len(digits):]}"
    try:
        return datetime.fromisoformat(s).timestamp()
    except ValueError:
        raise TraceError(f"{where}: TIMESTAMP {v!r} is not a datetime (e.g. 2023-11-16 18:15:46.680590)") from None


def _parse_csv(text: str, path: str) -> list[tuple[str, float, int | None, int, str | None, int]]:
    reader = csv.reader(io.StringIO(text))
    rows = []
    header: list[str] | None = None
    for lineno, row in enumerate(reader, start=1):
        if not row or not any(c.strip() for c in row):
            continue
        if header is None:
            header = [c.strip() for c in row]
            need = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
            if any(k not in header for k in need):
                raise TraceError(f"trace '{path}': line {lineno}: expected the header {','.join(need)}, "
                                 f"got {','.join(header)[:200]}")
            continue
        where = f"trace '{path}': line {lineno}"
        if len(row) != len(header):
            raise TraceError(f"{where}: {len(row)} fields, the header has {len(header)}")
        rec = dict(zip(header, row))
        vals: dict[str, Any] = {}
        for k in ("ContextTokens", "GeneratedTokens"):
            try:
                vals[k] = int(rec[k].strip())
            except ValueError:
                raise TraceError(f"{where}: \"{k}\" must be an integer, got {rec[k]!r}") from None
        rows.append(("azure", _azure_time(rec["TIMESTAMP"], where), _int(vals, "ContextTokens", where),
                     _int(vals, "GeneratedTokens", where), None, lineno))
    return rows


def parse_trace(text: str, path: str = "<trace>", *, csv_shape: bool = False, time_scale: float = 1.0,
                max_context: int | None = None, tokenize: Callable[[str], Sequence[int]] | None = None,
                sha256: str = "") -> Trace:
    """The :class:`Trace` of a file's ``text`` (the module docstring's rules)."""
    if not (isinstance(time_scale, (int, float)) and math.isfinite(time_scale) and time_scale > 0):
        raise TraceError(f"trace '{path}': time scale {time_scale!r} must be a positive number")
    rows = _parse_csv(text, path) if csv_shape else _parse_jsonl(text, path)
    if not rows:
        raise TraceError(f"trace '{path}': no requests; expected one request per line")
    if len(rows) > MAX_REQUESTS:
        raise TraceError(f"trace '{path}': {len(rows)} requests, at most {MAX_REQUESTS:,} are read")
    shape = rows[0][0]
    for r in rows:
        if r[0] != shape:
            raise TraceError(f"trace '{path}': line {r[5]} is a {r[0]} line in a {shape} trace (line {rows[0][5]}); "
                             "one shape per file")
    reqs = []
    for _shape, t, inp, out, text_, lineno in rows:
        ids: tuple[int, ...] | None = None
        if text_ is not None:
            if tokenize is None:
                raise TraceError(f"trace '{path}': line {lineno} has a text and no tokenizer was given")
            ids = tuple(int(i) for i in tokenize(text_))
            if not ids:
                raise TraceError(f"trace '{path}': line {lineno}: the text tokenizes to no tokens")
            inp = len(ids)
        assert inp is not None
        if max_context is not None and inp + out > max_context:
            raise TraceError(f"trace '{path}': line {lineno}: {inp} input + {out} output tokens exceed the model's "
                             f"context of {max_context} (serving.max_model_len or max_position_embeddings)")
        reqs.append((t, lineno, inp, out, ids))
    reqs.sort(key=lambda r: (r[0], r[1]))
    t0 = reqs[0][0]
    return Trace(path=path, sha256=sha256, shape=shape, time_scale=float(time_scale),
                 requests=tuple(TraceRequest(arrival_s=(t - t0) / time_scale, input_len=i, output_len=o, line=ln,
                                             ids=ids) for t, ln, i, o, ids in reqs))


def load_trace(path: str | Path, *, time_scale: float = 1.0, max_context: int | None = None,
               tokenize: Callable[[str], Sequence[int]] | None = None) -> Trace:
    """Read and validate the trace file ``path`` (``.csv``: the Azure shape; else JSONL)."""
    p = Path(path).expanduser()
    try:
        blob = p.read_bytes()
    except FileNotFoundError:
        raise TraceError(f"trace '{path}': not found; expected a JSONL (or Azure CSV) file of requests") from None
    except OSError as exc:
        raise TraceError(f"trace '{path}': cannot be read ({exc.strerror})") from None
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(f"trace '{path}': not UTF-8 (byte {exc.start})") from None
    return parse_trace(text, str(path), csv_shape=p.suffix.lower() == ".csv", time_scale=time_scale,
                       max_context=max_context, tokenize=tokenize, sha256=hashlib.sha256(blob).hexdigest())
