"""benchmarks/loadgen_vs_vllm_bench.py (issue 31, item 4): its pure parts. The per-tool spread, the paired
ratio inferloom / vllm and its t interval, computed from two saved results of each tool (field names of
``vllm bench serve --save-result``), and the bench command it runs. No server, no timing."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from loadgen_vs_vllm_bench import compare, keep, markdown_table, paired_ratio, spread, vllm_bench_argv  # noqa: E402


def _result(tput: float, ttft: float, itls: list[list[float]] | None = None) -> dict:
    return {"output_throughput": tput, "median_ttft_ms": ttft, "duration": 512 / tput, "completed": 16, "failed": 0,
            "input_lens": [64] * 15 + [65], "itls": itls or [[0.01] * 31] * 16, "generated_texts": ["x"] * 16}


def test_spread_is_median_range_and_iqr_numpy_style() -> None:
    s = spread([4.0, 1.0, 3.0, None, 2.0])
    assert (s["n"], s["missing"], s["median"], s["min"], s["max"]) == (4, 1, 2.5, 1.0, 4.0)
    assert s["q1"] == pytest.approx(1.75) and s["q3"] == pytest.approx(3.25)  # numpy.percentile(.., 25 / 75)
    assert spread([None])["median"] is None


def test_paired_ratio_from_two_saved_results_per_tool() -> None:
    inferloom = [_result(110.0, 50.0), _result(90.0, 40.0)]
    vllm = [_result(100.0, 40.0), _result(100.0, 50.0)]
    rounds = [{"inferloom": keep(a), "vllm": keep(b)} for a, b in zip(inferloom, vllm)]
    c = compare(rounds)
    r = c["output_throughput"]["ratio"]
    assert r["ratios"] == pytest.approx([1.1, 0.9])
    assert r["median"] == pytest.approx(1.0)
    assert r["geo_mean"] == pytest.approx(math.sqrt(1.1 * 0.9))
    # t interval of the mean log-ratio, 1 degree of freedom: t(0.975, 1) = 12.706
    logs = [math.log(1.1), math.log(0.9)]
    half = 12.7062047 * abs(logs[0] - logs[1]) / math.sqrt(2) / math.sqrt(2)
    m = sum(logs) / 2
    assert r["ci_low"] == pytest.approx(math.exp(m - half), rel=1e-6)
    assert r["ci_high"] == pytest.approx(math.exp(m + half), rel=1e-6)
    assert c["output_throughput"]["vllm"]["median"] == 100.0
    assert c["median_ttft_ms"]["ratio"]["ratios"] == pytest.approx([1.25, 0.8])
    table = markdown_table(c)
    assert "| output tok/s | 100.00 [90.00-110.00] | 100.00 [100.00-100.00] | 1.000 |" in table


def test_a_failed_round_is_left_out_of_the_ratio_not_counted_as_zero() -> None:
    r = paired_ratio([100.0, None, 80.0], [100.0, 90.0, None])
    assert r["ratios"] == [1.0] and r["n"] == 1 and r["ci_low"] is None
    with pytest.raises(ValueError):
        paired_ratio([1.0], [1.0, 2.0])


def test_keep_summarizes_per_request_lists() -> None:
    k = keep(_result(100.0, 40.0, itls=[[0.01] * 31] * 15 + [[0.01] * 29]))
    assert k["input_lens_min_max"] == [64, 65]
    assert k["chunks_per_request_min_max"] == [30, 32]
    assert "itls" not in k and "generated_texts" not in k


def test_bench_command_matches_the_load_generators_traffic() -> None:
    argv = vllm_bench_argv("/tmp/vllm-py", base_url="http://127.0.0.1:8000", served_name="inferloom-model",
                           tokenizer="/m", concurrency=64, input_len=256, output_len=128, num_prompts=192, seed=7,
                           result_dir="/r", result_filename="v.json", warmups=64)
    assert argv[0] == "/tmp/vllm-py" and argv[1] == "-c"
    for flag, value in {"--backend": "vllm", "--endpoint": "/v1/completions", "--dataset-name": "random",
                        "--random-input-len": "256", "--random-output-len": "128", "--random-range-ratio": "0",
                        "--max-concurrency": "64", "--num-prompts": "192", "--seed": "7",
                        "--served-model-name": "inferloom-model"}.items():
        assert argv[argv.index(flag) + 1] == value, flag
    assert "--ignore-eos" in argv and "--save-result" in argv and argv[-2:] == ["--temperature", "0"]


def test_server_side_means_from_two_metrics_snapshots() -> None:
    from loadgen_vs_vllm_bench import parse_prometheus, server_side

    before = parse_prometheus('# HELP x\nvllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 1.5\n'
                              'vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 10.0\n'
                              'vllm:generation_tokens_total{engine="0"} 100.0\n')
    after = parse_prometheus('vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 3.5\n'
                             'vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 30.0\n'
                             'vllm:generation_tokens_total{engine="0"} 740.0\n')
    s = server_side(before, after)
    assert s["server_mean_time_to_first_token_ms"] == pytest.approx(100.0)  # 2 s over 20 requests
    assert s["server_time_to_first_token_count"] == 20
    assert s["server_generation_tokens_total"] == 640
    assert s["server_mean_inter_token_latency_ms"] is None  # absent: no mean invented


def test_a_round_cut_short_keeps_the_tool_that_finished() -> None:
    c = compare([{"inferloom": keep(_result(100.0, 40.0))}])  # cut before vllm's run: no "vllm" key
    assert c["output_throughput"]["inferloom"]["median"] == 100.0
    assert c["output_throughput"]["vllm"]["n"] == 0 and c["output_throughput"]["ratio"]["n"] == 0
    assert "| output tok/s | 100.00 [100.00-100.00] | - | - | - |" in markdown_table(c)
