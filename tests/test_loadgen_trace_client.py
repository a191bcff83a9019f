"""The load generator's trace replay (run_load with arrivals): each request is sent at its offset (within a
tolerance: the machine is shared), whatever is in flight unless a cap is given, with its own output length;
against a small streaming fake of /v1/completions."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from aiohttp import web

from inferloom.loadgen.client import run_load
from inferloom.loadgen.metrics import summarize

TOL_S = 0.15  # 2 shared cores: generous, still far below the gaps tested


class FakeServer:
    """Streams ``max_tokens`` chunks, ``delay_s`` apart, then the usage block; records when each request came."""

    def __init__(self, delay_s: float = 0.02) -> None:
        self.delay_s = delay_s
        self.arrived: list[tuple[float, int, int]] = []  # (perf_counter, prompt length, max_tokens)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.arrived.append((time.perf_counter(), len(body["prompt"]), int(body["max_tokens"])))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(body["max_tokens"]):
            await asyncio.sleep(self.delay_s)
            await resp.write(b"data: " + json.dumps({"choices": [{"text": "x", "finish_reason": None}]}).encode()
                             + b"\n\n")
        usage = {"completion_tokens": body["max_tokens"], "prompt_tokens": len(body["prompt"])}
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self._loop.run_forever()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def server():
    s = FakeServer()
    yield s
    s.close()


def test_requests_are_sent_at_their_offsets_with_their_own_output_lengths(server):
    offsets = [0.0, 0.0, 0.25, 0.3, 0.7, 1.0]
    outs = [3, 9, 1, 6, 12, 2]
    prompts = [[5] * n for n in (4, 8, 2, 16, 3, 7)]
    records, duration = run_load(server.url, "m", prompts, outs, concurrency=None, arrivals=offsets, seed=1)
    assert all(r.success for r in records), [r.error for r in records]
    assert [r.output_tokens for r in records] == outs  # per-request lengths asked and counted
    assert sorted(a[2] for a in server.arrived) == sorted(outs)
    t0 = records[0].start
    for r, off in zip(records, offsets):
        assert abs((r.start - t0) - off) < TOL_S, (r.start - t0, off)
        assert r.send_lag is not None and 0 <= r.send_lag < TOL_S
    # the server saw them at those times too (12 tokens x 20 ms in flight: no request waited for another)
    seen = sorted(a[0] for a in server.arrived)
    for s, off in zip(seen, offsets):
        assert abs((s - seen[0]) - off) < TOL_S
    s = summarize(records, duration)
    assert s["output_lens"] == outs and s["input_lens"] == [4, 8, 2, 16, 3, 7]
    assert s["total_output_tokens"] == sum(outs) and duration >= 1.0


def test_a_cap_holds_requests_until_a_slot_frees(server):
    server.delay_s = 0.05
    offsets = [0.0, 0.0, 0.0]
    records, _ = run_load(server.url, "m", [[1, 2]] * 3, [6, 6, 6], concurrency=1, arrivals=offsets)
    assert all(r.success for r in records)
    starts = sorted(r.start for r in records)
    assert starts[1] - starts[0] > 0.25 and starts[2] - starts[1] > 0.25  # one at a time (6 x 50 ms each)
    assert max(r.send_lag for r in records) > 0.5  # how late the last was sent is recorded


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="trace replay"):
        run_load("http://127.0.0.1:9", "m", [[1]], 1, concurrency=None)
    with pytest.raises(ValueError, match="non-decreasing"):
        run_load("http://127.0.0.1:9", "m", [[1], [1]], 1, concurrency=None, arrivals=[0.5, 0.1])
    with pytest.raises(ValueError, match="2 output lengths for 1 prompts"):
        run_load("http://127.0.0.1:9", "m", [[1]], [1, 2], concurrency=2)
    with pytest.raises(ValueError, match="not both"):
        run_load("http://127.0.0.1:9", "m", [[1]], 1, concurrency=2, request_rate=1.0, arrivals=[0.0])
