"""Async streaming load generator for an OpenAI-compatible ``/v1/completions``.

:func:`run_load` sends ``prompts`` (token-id lists) with a fixed number in
flight (``concurrency``) or as a Poisson process at ``request_rate`` req/s
(exponential gaps drawn from ``seed``, optionally capped at ``concurrency`` in
flight), streams every response, and returns one :class:`RequestRecord` per
request plus the run's duration. Warm-up requests are sent first and are not
in the records or the duration.

Each request asks for exactly ``output_len`` tokens (``ignore_eos``), greedy,
and for the usage block at the end of the stream (the server's own token
count, and its count of the prompt's tokens: ``server_prompt_tokens``). A
transport error, an HTTP error, or a short response is recorded on that
request (``success=False``, ``error`` set); it never raises.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any, Callable, Sequence

from inferloom.loadgen.metrics import RequestRecord
from inferloom.spec import ServingSpec, field_default

__all__ = ["run_load", "completion_body"]


def completion_body(model: str, prompt: Sequence[int], output_len: int, **extra: Any) -> dict[str, Any]:
    return {"model": model, "prompt": list(prompt), "max_tokens": output_len, "min_tokens": output_len,
            "ignore_eos": True, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, **extra}


async def _one(session: Any, url: str, body: dict[str, Any], timeout_s: float) -> RequestRecord:
    import aiohttp

    rec = RequestRecord(start=time.perf_counter(), prompt_len=len(body["prompt"]))
    want = int(body["max_tokens"])
    chunks_with_text = 0
    usage_tokens: int | None = None
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                rec.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return rec
            buf = b""
            async for raw in resp.content.iter_any():
                now = time.perf_counter()
                buf += raw
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    for line in event.split(b"\n"):
                        line = line.strip()
                        if not line.startswith(b"data:"):
                            continue
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            continue
                        msg = json.loads(data)
                        if msg.get("error"):
                            raise RuntimeError(f"server error in stream: {msg['error']}")
                        if msg.get("usage"):
                            usage_tokens = int(msg["usage"].get("completion_tokens") or 0)
                            if msg["usage"].get("prompt_tokens") is not None:
                                rec.server_prompt_tokens = int(msg["usage"]["prompt_tokens"])
                        choices = msg.get("choices") or []
                        if choices and (choices[0].get("text") or choices[0].get("finish_reason") is None):
                            if rec.ttft is None:
                                rec.ttft = now - rec.start
                            rec.chunk_times.append(now)
                            chunks_with_text += 1
        end = time.perf_counter()
        rec.latency = (rec.chunk_times[-1] if rec.chunk_times else end) - rec.start
        rec.output_tokens = usage_tokens if usage_tokens is not None else chunks_with_text
        if rec.output_tokens != want:
            rec.error = f"short response: {rec.output_tokens} output tokens, expected {want}"
            return rec
        rec.success = True
    except asyncio.TimeoutError:
        rec.error = f"timeout after {timeout_s:g} s"
    except Exception as exc:  # noqa: BLE001 - a failed request is data
        rec.error = f"{type(exc).__name__}: {exc}"[:500]
    return rec


async def _run(base_url: str, model: str, prompts: Sequence[Sequence[int]], output_lens: Sequence[int], *,
               concurrency: int | None, request_rate: float | None, seed: int, warmup: Sequence[Sequence[int]],
               timeout_s: float, extra_body: dict[str, Any], progress: Callable[[str], None],
               arrivals: Sequence[float] | None = None) -> tuple[list[RequestRecord], float]:
    import aiohttp

    url = base_url.rstrip("/") + "/v1/completions"
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:
        sem = asyncio.Semaphore(concurrency) if concurrency is not None else None

        async def bounded(p: Sequence[int], out_len: int, due: float | None = None) -> RequestRecord:
            if sem is None:
                rec = await _one(session, url, completion_body(model, p, out_len, **extra_body), timeout_s)
            else:
                async with sem:
                    rec = await _one(session, url, completion_body(model, p, out_len, **extra_body), timeout_s)
            if due is not None:
                rec.send_lag = rec.start - due
            return rec

        if warmup:
            progress(f"load: {len(warmup)} warm-up requests (not timed)")
            await asyncio.gather(*(bounded(p, output_lens[0]) for p in warmup))
        rng = random.Random(seed)
        t0 = time.perf_counter()
        tasks = []
        for i, p in enumerate(prompts):
            due = None
            if arrivals is not None:
                due = t0 + arrivals[i]
                wait = due - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
            elif request_rate is not None and i > 0:
                await asyncio.sleep(rng.expovariate(request_rate))
            tasks.append(asyncio.ensure_future(bounded(p, output_lens[i], due)))
        records = list(await asyncio.gather(*tasks))
        ends = [r.start + r.latency for r in records if r.latency is not None]
        duration = (max(ends) if ends else time.perf_counter()) - t0
        return records, duration


def run_load(base_url: str, model: str, prompts: Sequence[Sequence[int]], output_len: int | Sequence[int], *,
             concurrency: int | None, request_rate: float | None = None, seed: int = 0,
             warmup: Sequence[Sequence[int]] = (),
             timeout_s: float = field_default(ServingSpec, "request_timeout_s"),
             extra_body: dict[str, Any] | None = None,
             progress: Callable[[str], None] = lambda _m: None,
             arrivals: Sequence[float] | None = None) -> tuple[list[RequestRecord], float]:
    """Blocking wrapper (a fresh event loop per run). Returns (records, duration_s). ``output_len``: one
    length, or one per prompt (warm-ups take the first); ``arrivals``: a trace's send offsets (seconds
    after the first request, non-decreasing); ``concurrency`` None: no cap (trace replays only)."""
    if concurrency is None and arrivals is None:
        raise ValueError("concurrency None (no cap) is for a trace replay (arrivals) only")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency {concurrency}: expected >= 1")
    if request_rate is not None and not request_rate > 0:
        raise ValueError(f"request_rate {request_rate}: expected a positive rate or None")
    if request_rate is not None and arrivals is not None:
        raise ValueError("request_rate and arrivals: a run has Poisson arrivals or a trace's, not both")
    lens = [int(output_len)] * max(1, len(prompts)) if isinstance(output_len, int) else [int(x) for x in output_len]
    if not isinstance(output_len, int) and len(lens) != len(prompts):
        raise ValueError(f"{len(lens)} output lengths for {len(prompts)} prompts")
    if arrivals is not None and (len(arrivals) != len(prompts)
                                 or any(b < a for a, b in zip(arrivals, arrivals[1:])) or min(arrivals, default=0) < 0):
        raise ValueError("arrivals: one non-negative, non-decreasing offset per prompt")
    if not lens:
        lens = [1]
    return asyncio.run(_run(base_url, model, prompts, lens, concurrency=concurrency, request_rate=request_rate,
                            seed=seed, warmup=warmup, timeout_s=timeout_s, extra_body=dict(extra_body or {}),
                            progress=progress, arrivals=None if arrivals is None else [float(a) for a in arrivals]))
