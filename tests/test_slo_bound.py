"""Did the goodput SLOs bind? On serving summaries from the load generator's own
summarize(), and on the H200 goodput A/A committed in docs/results (run 3)."""

import json

import pytest
from pathlib import Path

from inferloom.loadgen.metrics import SLO, RequestRecord, summarize
from inferloom.measure.slo_bound import slo_binding

ROOT = Path(__file__).resolve().parents[1]


def _rec(ttft, gap, n=8):
    times = [ttft + i * gap for i in range(n)]
    return RequestRecord(start=0.0, prompt_len=10, success=True, ttft=ttft, chunk_times=times, output_tokens=n,
                         latency=times[-1], error=None)


def _pairs(*runs):
    """Protocol pairs whose arms carry the given serving summaries."""
    return [{"a": {"extra": {"serving": a}}, "b": {"extra": {"serving": b}}} for a, b in zip(runs[::2], runs[1::2])]


def test_slos_that_every_request_meets_are_reported_as_not_binding():
    slo = SLO(ttft_ms=500, tpot_ms=50)
    runs = [summarize([_rec(0.04, 0.008), _rec(0.09, 0.010)], 1.0, slo) for _ in range(4)]
    b = slo_binding(_pairs(*runs))
    assert b["binding"] is False and b["missed_slo"] == 0 and b["completed"] == 8 and b["runs"] == 4
    assert b["max_p99_ttft_ms"] <= 90.0 + 1e-6 and b["max_p99_tpot_ms"] <= 10.0 + 1e-6
    assert "never bound" in b["note"] and "request_rate" in b["note"]


def test_a_run_with_misses_binds_and_counts_them():
    slo = SLO(ttft_ms=100)
    ok = summarize([_rec(0.05, 0.01)] * 3, 1.0, slo)
    late = summarize([_rec(0.05, 0.01), _rec(0.3, 0.01)], 1.0, slo)
    b = slo_binding(_pairs(ok, late))
    assert b["binding"] is True and b["missed_slo"] == 1 and b["completed"] == 5 and "note" not in b
    assert b["missed_fraction"] == 0.2 and b["max_p99_ttft_ms"] > 100


def test_no_slo_no_answer():
    runs = [summarize([_rec(0.05, 0.01)], 1.0, SLO()) for _ in range(2)]
    assert slo_binding(_pairs(*runs)) is None
    assert slo_binding([{"a": {"extra": {}}, "b": None}]) is None


def test_the_h200_goodput_run_never_bound():
    res = json.loads((ROOT / "docs/results/h200-vllm-2026-12-01-s25/goodput-stock-aa.json").read_text())
    b = slo_binding(res["protocol"]["pairs"])
    assert b["runs"] == 6 and b["completed"] == 2400 and b["binding"] is False
    assert 100 < b["max_p99_ttft_ms"] < 500 and b["max_p99_tpot_ms"] < 50


def test_bench_output_says_so(tmp_path):
    from rich.console import Console

    from inferloom.report.console import print_bench
    res = json.loads((ROOT / "docs/results/h200-vllm-2026-12-01-s25/goodput-stock-aa.json").read_text())
    res["slo_binding"] = slo_binding(res["protocol"]["pairs"])
    con = Console(record=True, width=400)
    print_bench(res, con, str(tmp_path / "r.json"))
    assert "the SLOs never bound: all 2400 requests of 6 timed runs met them" in con.export_text()


class _GoodputRuns:
    """Synthetic runs that carry a load generator's serving summary: ``missed`` requests of each run miss the
    SLOs (their goodput is what's left)."""

    def __init__(self, missed):
        from inferloom.workloads.synthetic import SyntheticAdapter

        class A(SyntheticAdapter):
            def run(s, handle, seed):
                rec = super().run(handle, seed)
                if rec.success:
                    good = 20 - missed
                    rec.extra["serving"] = {"completed": 20, "good_requests": good, "p99_ttft_ms": 80.0,
                                            "goodput_slo_ms": {"ttft_ms": 500.0},
                                            "request_goodput": rec.output_tokens / rec.wall_s / 100.0 * good / 20}
                return rec
        self.adapter = A()


@pytest.mark.parametrize("missed,warned", [(0, True), (3, False)])
def test_a_goodput_session_warns_in_prelude_when_the_slos_never_bound(tmp_path, missed, warned):
    from inferloom.agents.rules import RuleCritic, RuleOrchestrator, RuleRobustness
    from inferloom.phases.runner import start
    from inferloom.spec import load_spec
    spec = load_spec(None, {"model": "llama-tiny", "framework": "vllm", "device": "cpu", "objective": "goodput",
                            "serving.slo_ttft_ms": 500, "protocol.bootstrap_resamples": 999,
                            "quality.eval_prompts": 4, "quality.heldout_prompts": 4, "quality.prompt_len": 8,
                            "quality.continuation_len": 8})
    said = []
    start(tmp_path / "s", spec, budget_minutes=5, max_trials=1, adapter=_GoodputRuns(missed).adapter,
          agents={"orchestrator": RuleOrchestrator(seed=0), "critic_factory": RuleCritic,
                  "robustness": RuleRobustness()}, progress=said.append, sweep=False)
    warn = [m for m in said if "SLOs never bound" in m]
    assert bool(warn) is warned, said[:20]
    if warned:
        assert warn[0].startswith("PRELUDE: warning: the SLOs never bound: all") and "request_rate" in warn[0]
