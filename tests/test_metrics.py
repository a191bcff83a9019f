"""Metrics are pure functions of raw run records."""

from __future__ import annotations

import math

import pytest

from inferloom.measure import metrics as M
from inferloom.workloads.base import RunRecord


def rec(wall: float = 2.0, out: int = 100, inp: int = 50, ok: bool = True, reqs: int = 4) -> RunRecord:
    return RunRecord(config_id="c", seed=1, success=ok, wall_s=wall, output_tokens=out,
                     input_tokens=inp, num_requests=reqs, error=None if ok else "boom")


def test_throughputs():
    r = rec()
    assert M.output_tokens_per_s(r) == 50.0
    assert M.total_tokens_per_s(r) == 75.0
    assert M.requests_per_s(r) == 2.0
    assert M.get_metric("output_tokens_per_s") is M.output_tokens_per_s


def test_failed_record_has_no_throughput():
    with pytest.raises(ValueError, match="failed"):
        M.output_tokens_per_s(rec(ok=False))
    with pytest.raises(ValueError, match="failed"):
        M.total_tokens_per_s(rec(ok=False))


@pytest.mark.parametrize("wall", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_wall_time(wall):
    with pytest.raises(ValueError, match="wall_s"):
        M.output_tokens_per_s(rec(wall=wall))


def test_unknown_metric():
    with pytest.raises(ValueError, match="objective 'nope'"):
        M.get_metric("nope")


def test_log_ratios_values_and_records():
    assert M.log_ratio(100.0, 110.0) == pytest.approx(math.log(1.1))
    assert M.log_ratios([(1.0, 2.0), (2.0, 1.0)]) == pytest.approx([math.log(2), -math.log(2)])
    # B twice as fast: half the wall time for the same tokens
    assert M.log_ratio(rec(wall=2.0), rec(wall=1.0)) == pytest.approx(math.log(2))
    with pytest.raises(ValueError):
        M.log_ratio(0.0, 1.0)
    with pytest.raises(ValueError):
        M.log_ratios([(rec(), rec(ok=False))])


def test_summarize():
    s = M.summarize([3, 1, 2, 10])
    assert s == {"n": 4, "median": 2.5, "mean": 4.0, "sd": pytest.approx(4.082, abs=1e-3),
                 "min": 1.0, "max": 10.0}
    assert M.summarize([5.0])["sd"] == 0.0
    with pytest.raises(ValueError):
        M.summarize([])


def test_pure_no_mutation():
    r = rec()
    before = r.to_dict()
    M.output_tokens_per_s(r)
    M.summarize([1.0, 2.0])
    assert r.to_dict() == before
