"""Serving metrics: pure functions of per-request records.

A :class:`RequestRecord` is what the streaming client saw for one request: when
it was sent, when each streamed chunk arrived, how many output tokens the
server reported, and whether it succeeded. :func:`summarize` turns the records
of one timed run into a result whose field names are those of
``vllm bench serve --save-result`` wherever the metric is the same (listed in
``docs/loadgen.md``), so the two can be compared side by side.

Definitions (times in ms in the result, seconds in the records):

* TTFT: first chunk's arrival minus the request's send time.
* TPOT (per request): ``(e2el - ttft) / (output_tokens - 1)``; a request with
  one output token has no TPOT (it is left out of the TPOT statistics and
  passes a TPOT SLO, as in vLLM's benchmark).
* ITL: the gaps between consecutive chunks of a request (a chunk may carry
  more than one token, e.g. with speculative decoding; vLLM's benchmark
  measures ITL the same way).
* E2EL: last chunk's arrival (end of the response) minus the send time.
* goodput (``request_goodput``): completed requests meeting *every* declared
  SLO, per second of the run's duration. Failed requests never count.

Pure: no I/O, no clocks. Failed requests count in ``failed`` and ``errors``
and in no latency or throughput statistic.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

__all__ = ["RequestRecord", "SLO", "percentile", "request_tpot", "meets_slo", "summarize", "PERCENTILES"]

PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    """One request as the client saw it (times are ``time.perf_counter()`` seconds)."""

    start: float
    prompt_len: int
    success: bool = False
    ttft: float | None = None  # seconds after start
    chunk_times: list[float] = field(default_factory=list)  # absolute arrival times of streamed chunks
    output_tokens: int = 0
    latency: float | None = None  # end-to-end, seconds
    error: str | None = None
    server_prompt_tokens: int | None = None  # the server's own count of the prompt (usage.prompt_tokens)
    send_lag: float | None = None  # a trace replay: seconds sent after its scheduled arrival

    @property
    def itl(self) -> list[float]:
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:])]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SLO:
    """Service-level objectives in milliseconds; None = not declared."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def declared(self) -> dict[str, float]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolation percentile (numpy's default method), pure Python."""
    vals = sorted(float(v) for v in values)
    if not vals:
        raise ValueError("percentile of no values")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p}: expected 0..100")
    pos = (len(vals) - 1) * p / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def request_tpot(r: RequestRecord) -> float | None:
    """Seconds per output token after the first, or None (failed, or one token)."""
    if not r.success or r.latency is None or r.ttft is None or r.output_tokens < 2:
        return None
    return (r.latency - r.ttft) / (r.output_tokens - 1)


def meets_slo(r: RequestRecord, slo: SLO) -> bool:
    """A successful request meeting every declared SLO (a missing TPOT passes)."""
    if not r.success:
        return False
    if slo.ttft_ms is not None and (r.ttft is None or r.ttft * 1000.0 > slo.ttft_ms):
        return False
    if slo.tpot_ms is not None:
        tp = request_tpot(r)
        if tp is not None and tp * 1000.0 > slo.tpot_ms:
            return False
    if slo.e2el_ms is not None and (r.latency is None or r.latency * 1000.0 > slo.e2el_ms):
        return False
    return True


def _stats(prefix: str, values_s: Sequence[float], out: dict[str, Any]) -> None:
    ms = [v * 1000.0 for v in values_s]
    if ms:
        out[f"mean_{prefix}_ms"] = statistics.fmean(ms)
        out[f"median_{prefix}_ms"] = statistics.median(ms)
        out[f"std_{prefix}_ms"] = statistics.pstdev(ms)
        for p in PERCENTILES:
            out[f"p{p}_{prefix}_ms"] = percentile(ms, p)
    else:
        for k in ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES)):
            out[f"{k}_{prefix}_ms"] = None


def summarize(records: Sequence[RequestRecord], duration_s: float, slo: SLO | None = None,
              extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The result of one timed run (see the module docstring). ``duration_s``:
    from the first request sent to the last response finished. Throughputs are
    ``None`` when the duration is not positive."""
    slo = slo or SLO()
    ok = [r for r in records if r.success]
    bad = [r for r in records if not r.success]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    good = sum(1 for r in ok if meets_slo(r, slo))
    pos = duration_s > 0
    out: dict[str, Any] = {
        "duration": duration_s,
        "completed": len(ok),
        "failed": len(bad),
        "num_prompts": len(records),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration_s if pos else None,
        "request_goodput": good / duration_s if pos and slo.declared() else None,
        "output_throughput": total_out / duration_s if pos else None,
        "total_token_throughput": (total_in + total_out) / duration_s if pos else None,
        "goodput_slo_ms": slo.declared(),
        "good_requests": good if slo.declared() else None,
    }
    _stats("ttft", [r.ttft for r in ok if r.ttft is not None], out)
    _stats("tpot", [t for t in (request_tpot(r) for r in ok) if t is not None], out)
    _stats("itl", [g for r in ok for g in r.itl], out)
    _stats("e2el", [r.latency for r in ok if r.latency is not None], out)
    out["input_lens"] = [r.prompt_len for r in records]
    counted = [r for r in ok if r.server_prompt_tokens is not None]
    # completed requests whose prompt the server counted differently from what was sent (None: it counted none)
    out["server_input_mismatches"] = sum(r.server_prompt_tokens != r.prompt_len for r in counted) if counted else None
    out["output_lens"] = [r.output_tokens if r.success else 0 for r in records]
    out["ttfts"] = [r.ttft if r.ttft is not None else 0.0 for r in records]
    out["itls"] = [r.itl for r in records]
    out["errors"] = [r.error or "" for r in records]
    out.update(extra or {})
    return out
