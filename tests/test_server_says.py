"""What a server's own log says it runs (workloads/server_says.py), read from logs of real servers published
under docs/results (vLLM 0.26.0 and SGLang 0.5.17 on the H200, 2026-12-02/05), and what the search does with
stock's: a change to a value stock already runs starts the same server, so it is never proposed."""

from __future__ import annotations

from pathlib import Path

from inferloom.agents.rules import RuleOrchestrator
from inferloom.agents.search_view import SearchView
from inferloom.phases.allowlist import validate_proposal
from inferloom.workloads import sglang_startup, vllm_startup
from inferloom.workloads.base import Knob
from inferloom.workloads.server_says import knob_value, knob_values
from inferloom.workloads.sglang_knobs import sglang_knobs
from inferloom.workloads.vllm_knobs import vllm_knobs

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
RUN2 = RESULTS / "sglang-h200-2026-12-05" / "run2"
H200 = {"model": "llama-3.1-8b", "dtype": "bfloat16", "concurrency": 64, "input_len": 256, "output_len": 128}


def test_a_stock_vllm_log_says_async_scheduling_full_graphs_and_its_chunk_size():
    runs = knob_values(vllm_startup.says((RUN2 / "vs-first-server.log").read_text()), vllm_knobs(64))
    assert {k: v["value"] for k, v in runs.items()} == {
        "async_scheduling": True, "cudagraph_mode": "FULL_AND_PIECEWISE", "max_cudagraph_capture_size": "512",
        "max_num_batched_tokens": 8192,
        "chunked_prefill": "on", "prefix_caching": "on", "attention_backend": "FLASH_ATTN"}
    assert runs["async_scheduling"]["said"].endswith("Asynchronous scheduling is enabled.")
    assert "'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE" in runs["cudagraph_mode"]["said"]
    assert all(len(v["said"]) <= 210 for v in runs.values())  # a long configuration line is cut around the match


def test_the_async_scheduling_candidate_of_an_earlier_session_ran_what_stock_ran():
    # docs/results/smollm2-h200-vllm-2026-12-02/s31: trial 1 measured async_scheduling=True (+5.4%, reverted);
    # the stock server's log and the candidate's say the same: it was an A/A
    servers = RESULTS / "smollm2-h200-vllm-2026-12-02" / "s31" / "servers"
    stock = knob_values(vllm_startup.says((servers / "01-fad658bc.log").read_text()), vllm_knobs(64))
    cand = knob_values(vllm_startup.says((servers / "03-b54f94cb.log").read_text()), vllm_knobs(64))
    assert stock["async_scheduling"]["value"] is True and cand["async_scheduling"]["value"] is True


def test_an_sglang_log_says_its_attention_backend_chunk_and_policy():
    runs = knob_values(sglang_startup.says((RUN2 / "sg-first-server.log").read_text()), sglang_knobs(64))
    # schedule_conservativeness=1.0 is none of the knob's values; kv_cache_dtype auto and the radix cache on are
    # the knobs' defaults: not kept
    assert {k: v["value"] for k, v in runs.items()} == {
        "attention_backend": "triton", "chunked_prefill_size": "8192", "schedule_policy": "fcfs"}
    assert "chunked_prefill_size=8192" in runs["chunked_prefill_size"]["said"]
    assert sglang_startup.says("no configuration line here") == {} and vllm_startup.says("") == {}


def test_a_raw_value_becomes_a_knob_value_or_nothing():
    b = Knob("x", "bool", False, "")
    i = Knob("n", "int", 0, "", low=0, high=100)
    c = Knob("c", "choice", "default", "", choices=("default", "0.5", "FLASH_ATTN"))
    assert knob_value(b, "enabled") is True and knob_value(b, "False") is False and knob_value(b, "maybe") is None
    assert knob_value(i, "64") == 64 and knob_value(i, "8192") is None and knob_value(i, "x") is None
    assert knob_value(i, "inf") is None and knob_value(i, "nan") is None  # a broken log: nothing, never a raise
    assert knob_value(c, "'0.50'") == "0.5" and knob_value(c, "flash_attn") == "FLASH_ATTN" and knob_value(c, "y") is None
    assert knob_values({"x": (False, "off"), "n": ("7", "n=7"), "zz": ("1", "")}, [b, i]) == {
        "n": {"value": 7, "said": "n=7"}}  # the default and an unknown knob: nothing


def _state(knobs, stock_runs, stack=None, pinned=None):
    stock = {k.name: k.default for k in knobs}
    return {"device": "cuda", "knobs": [k.to_dict() for k in knobs], "stock_config": stock,
            "stack": {**stock, **(stack or {})}, "pinned": pinned or {}, "trials": [], "workload": H200,
            "extra": {"roofline_stock": {"fraction": 0.70}, "stock_runs": stock_runs}}


RUNS = {"async_scheduling": {"value": True, "said": "Asynchronous scheduling is enabled."},
        "cudagraph_mode": {"value": "FULL_AND_PIECEWISE", "said": "'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE"}}


def test_the_orchestrator_never_proposes_what_stock_already_runs():
    knobs = vllm_knobs(64)
    pinned = {"quantization": "default"}  # the fp8-weights prior aside: the overhead levers come next
    before = RuleOrchestrator().propose(_state(knobs, {}, pinned=pinned))
    assert before["changes"] == {"async_scheduling": True}  # what the H200 sessions measured as a trial
    after = RuleOrchestrator().propose(_state(knobs, RUNS, pinned=pinned))
    assert after["action"] == "try_config"
    assert not set(after["changes"]) & {"async_scheduling", "cudagraph_mode"}, after
    # a stack that moved the knob off stock's value: setting it to what stock runs is a real change again
    change = {"cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert SearchView(_state(knobs, RUNS)).redundant(change) == change
    assert SearchView(_state(knobs, RUNS, stack={"cudagraph_mode": "NONE"})).redundant(change) == {}
    assert SearchView(_state(knobs, {})).redundant(change) == {}


def test_a_proposal_of_what_stock_runs_is_refused_by_name():
    knobs = vllm_knobs(64)
    state = _state(knobs, RUNS)
    raw = {"action": "try_config", "changes": {"async_scheduling": True}}
    proposal, rule, why = validate_proposal(raw, "FRAMEWORK", state, knobs)
    assert proposal is None and rule == "stock_runs_it"
    assert "async_scheduling=True: the stock server already runs it" in why and "Asynchronous scheduling" in why
    # with a real change beside it, the proposal stands (the no-op part changes nothing)
    proposal, rule, _ = validate_proposal({"action": "try_config", "changes": {"async_scheduling": True,
                                                                              "kv_cache_dtype": "fp8"}},
                                          "FRAMEWORK", state, knobs)
    assert rule is None and proposal["changes"]["kv_cache_dtype"] == "fp8"


def test_the_report_names_what_the_first_server_that_started_runs_not_a_failed_start():
    from inferloom.report.breakdown import server_starts
    says = {"async_scheduling": {"value": True, "line": "Asynchronous scheduling is enabled."}}
    failed = {"kind": "server_start", "seq": 3, "failed": True, "reason": "stock", "startup_s": 4.0}
    ok = {"kind": "server_start", "seq": 5, "reason": "enablement", "startup_s": 60.0, "server_runs": says}
    later = {"kind": "server_start", "seq": 9, "reason": "candidate", "startup_s": 50.0,
             "server_runs": {"cudagraph_mode": {"value": "NONE", "line": "x"}}}
    # stock failed and ENABLEMENT recovered it: the recovered stack's server is the one the line names
    assert server_starts([failed, ok, later])["stock_runs"] == {"values": {"async_scheduling": True}, "ledger_seq": 5}
    # the first server that started said nothing beyond the defaults: no line, not a later candidate's values
    assert "stock_runs" not in server_starts([dict(ok, server_runs={}), later])
