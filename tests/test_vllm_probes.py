"""How the vLLM quality probes issue their requests (workloads/vllm_probes.issue): one request per prompt
with at most ``concurrency`` in flight (1: one at a time), or all prompts in one request; the choices come
back in prompt order; every probe carries one fresh cache_salt. The real server's side of it (its own step
histogram) is tests/test_vllm_real.py."""

from __future__ import annotations

import threading
import time

import pytest

from inferloom.workloads.base import AdapterError
from inferloom.workloads.vllm_probes import issue


class _Post:
    def __init__(self, delay=0.0, shuffle=False):
        self.delay, self.shuffle = delay, shuffle
        self.bodies, self.live, self.most = [], 0, 0
        self.lock = threading.Lock()

    def __call__(self, body):
        with self.lock:
            self.bodies.append(body)
            self.live += 1
            self.most = max(self.most, self.live)
        time.sleep(self.delay)
        with self.lock:
            self.live -= 1
        chs = [{"index": i, "prompt": p} for i, p in enumerate(body["prompt"])]
        return {"choices": chs[::-1] if self.shuffle else chs}


PROMPTS = [[i, i + 1] for i in range(6)]


@pytest.mark.parametrize("concurrency", [1, 3])
def test_one_request_per_prompt_at_most_concurrency_in_flight_in_prompt_order(concurrency):
    post = _Post(delay=0.05)
    out = issue({"max_tokens": 2}, PROMPTS, concurrency, post)
    assert [c["prompt"] for c in out] == PROMPTS  # each choice answers its own prompt, in order
    assert len(post.bodies) == 6 and all(len(b["prompt"]) == 1 and b["max_tokens"] == 2 for b in post.bodies)
    assert post.most == concurrency
    salts = {b["cache_salt"] for b in post.bodies}
    assert len(salts) == 1 and next(iter(salts)).startswith("inferloom-quality-")  # one salt per probe ...
    again = _Post()
    issue({}, PROMPTS, concurrency, again)
    assert again.bodies[0]["cache_salt"] not in salts  # ... and a fresh one for the next


def test_all_prompts_in_one_request_reordered_by_index_and_a_short_answer_is_an_error():
    post = _Post(shuffle=True)
    out = issue({}, PROMPTS, None, post)
    assert len(post.bodies) == 1 and post.bodies[0]["prompt"] == PROMPTS
    assert [c["prompt"] for c in out] == PROMPTS
    with pytest.raises(AdapterError, match="5 choices for 6 prompts"):
        issue({}, PROMPTS, None, lambda b: {"choices": [{"index": i} for i in range(5)]})
