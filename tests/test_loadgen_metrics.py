"""Load generator metrics on hand-made request records (no server)."""

import math

import pytest

from inferloom.loadgen.metrics import SLO, RequestRecord, meets_slo, percentile, request_tpot, summarize


def rec(start, ttft, gaps, tokens=None, ok=True, prompt_len=10, error=None):
    """A request sent at ``start`` whose first chunk came ``ttft`` s later, then chunks ``gaps`` apart."""
    times = [start + ttft]
    for g in gaps:
        times.append(times[-1] + g)
    return RequestRecord(start=start, prompt_len=prompt_len, success=ok, ttft=ttft if ok else None,
                         chunk_times=times if ok else [], output_tokens=(tokens or len(times)) if ok else 0,
                         latency=(times[-1] - start) if ok else None, error=error)


def test_percentile_interpolates_like_numpy():
    vals = [1.0, 2.0, 3.0, 4.0]
    assert percentile(vals, 50) == 2.5
    assert percentile(vals, 90) == pytest.approx(3.7)
    assert percentile(vals, 0) == 1.0 and percentile(vals, 100) == 4.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_tpot_excludes_the_first_token_and_single_token_requests():
    r = rec(0.0, 0.5, [0.1, 0.1, 0.1])  # 4 tokens, latency 0.8
    assert request_tpot(r) == pytest.approx(0.1)
    assert request_tpot(rec(0.0, 0.5, [])) is None  # one token
    assert request_tpot(rec(0.0, 0.5, [0.1], ok=False, error="boom")) is None


def test_summary_uses_vllm_field_names_and_ignores_failed_requests_in_latency():
    recs = [rec(0.0, 0.1, [0.05] * 3), rec(0.0, 0.3, [0.05] * 3),
            rec(0.0, 0.0, [], ok=False, error="HTTP 500: boom")]
    s = summarize(recs, duration_s=2.0)
    for key in ("duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
                "output_throughput", "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
                "mean_tpot_ms", "mean_itl_ms", "p90_e2el_ms", "input_lens", "output_lens", "ttfts", "itls", "errors"):
        assert key in s
    assert s["completed"] == 2 and s["failed"] == 1 and s["num_prompts"] == 3
    assert s["total_output_tokens"] == 8 and s["total_input_tokens"] == 20
    assert s["output_throughput"] == pytest.approx(4.0)
    assert s["total_token_throughput"] == pytest.approx(14.0)
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["mean_ttft_ms"] == pytest.approx(200.0) and s["median_ttft_ms"] == pytest.approx(200.0)
    assert s["mean_tpot_ms"] == pytest.approx(50.0) and s["mean_itl_ms"] == pytest.approx(50.0)
    assert s["mean_e2el_ms"] == pytest.approx(((0.1 + 0.15) + (0.3 + 0.15)) / 2 * 1000)
    assert s["errors"][2] == "HTTP 500: boom" and s["output_lens"] == [4, 4, 0]
    assert s["request_goodput"] is None  # no SLO declared


def test_goodput_counts_requests_meeting_every_slo():
    fast = rec(0.0, 0.05, [0.01] * 9)  # ttft 50 ms, tpot 10 ms
    slow_first = rec(0.0, 0.5, [0.01] * 9)  # ttft 500 ms
    slow_decode = rec(0.0, 0.05, [0.04] * 9)  # tpot 40 ms
    failed = rec(0.0, 0.01, [], ok=False, error="Server disconnected")
    slo = SLO(ttft_ms=100, tpot_ms=20)
    assert meets_slo(fast, slo) and not meets_slo(slow_first, slo) and not meets_slo(slow_decode, slo)
    assert not meets_slo(failed, SLO(ttft_ms=1e9))  # a failed request never meets an SLO
    s = summarize([fast, slow_first, slow_decode, failed], duration_s=4.0, slo=slo)
    assert s["good_requests"] == 1 and s["request_goodput"] == pytest.approx(0.25)
    assert s["goodput_slo_ms"] == {"ttft_ms": 100, "tpot_ms": 20}
    # only a TTFT SLO: the slow decoder passes
    assert summarize([fast, slow_first, slow_decode], 4.0, SLO(ttft_ms=100))["good_requests"] == 2


def test_all_failed_run_has_no_latency_numbers_and_zero_throughput():
    s = summarize([rec(0.0, 0.0, [], ok=False, error="x")] * 3, duration_s=1.0, slo=SLO(ttft_ms=10))
    assert s["completed"] == 0 and s["failed"] == 3 and s["output_throughput"] == 0.0
    assert s["mean_ttft_ms"] is None and s["request_goodput"] == 0.0
    assert summarize([], 0.0)["output_throughput"] is None


def test_goodput_metric_reads_the_serving_result_and_refuses_without_one():
    from inferloom.measure.metrics import get_metric
    from inferloom.workloads.base import RunRecord

    m = get_metric("goodput")
    r = RunRecord(config_id="c", seed=1, success=True, wall_s=2.0, output_tokens=10,
                  extra={"serving": {"request_goodput": 3.5}})
    assert m(r) == 3.5
    with pytest.raises(ValueError, match="request_goodput"):
        m(RunRecord(config_id="c", seed=1, success=True, wall_s=2.0, output_tokens=10))
    assert math.isfinite(get_metric("output_tokens_per_s")(r))
