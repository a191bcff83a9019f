"""LLM clients through the real anthropic and openai SDKs against a scripted
server on localhost (tests/llm_scripted_server.py): structured output, one
repair then a named refusal, retries on 429/5xx, timeouts, budget, transcript;
the spec's agents.llm section; the Critic may only make a decision stricter."""

import json

import pytest

from inferloom.agents.llm_client import LLMClient, make_transport
from inferloom.agents.llm_record import EXCHANGES, LLMRefusal, ReplayTransport, read_exchanges
from inferloom.agents.llm_roles import ConfigProposal, LLMCritic
from inferloom.agents.llm_setup import LLMSetupError, check_llm
from inferloom.spec import SpecError, load_spec
from llm_scripted_server import ScriptedLLM, ok, slow, status, text

ENV = {"TEST_LLM_KEY": "sk-test-not-a-real-key"}
PROPOSAL = {"action": "try_config", "changes": {"fast_path": True}, "predicted_gain": 0.2, "rationale": "the profile"}


def llm_spec(provider, url, **kw):
    base = f"{url}/v1" if provider == "openai" else url
    over = {"framework": "synthetic", "agents.llm.provider": provider, "agents.llm.model": "scripted",
            "agents.llm.base_url": base, "agents.llm.api_key_env": "TEST_LLM_KEY", "agents.llm.max_retries": 0,
            "agents.llm.timeout_s": 5, **{f"agents.llm.{k}": v for k, v in kw.items()}}
    return load_spec(None, over).agents.llm


def client(provider, url, tmp_path, **kw):
    llm = llm_spec(provider, url, **kw)
    return LLMClient(llm, make_transport(llm, ENV), tmp_path)


def test_spec_section_defaults_flags_and_bad_values():
    spec = load_spec(None, {"framework": "synthetic"})
    assert spec.agents.llm is None  # deterministic agents are the default
    llm = load_spec(None, {"agents.llm.provider": "openai", "agents.llm.model": "m",
                           "agents.llm.roles": "orchestrator, critic,kernel_author"}).agents.llm
    assert llm.roles == ("orchestrator", "critic", "kernel_author") and llm.key_env == "OPENAI_API_KEY"
    assert llm.temperature is None and llm.max_total_tokens == 200_000
    with pytest.raises(SpecError, match="max_cost_usd needs usd_per_mtok_input"):
        load_spec(None, {"agents.llm.provider": "openai", "agents.llm.model": "m", "agents.llm.max_cost_usd": "1"})
    with pytest.raises(SpecError, match="agents.llm.provider"):
        load_spec(None, {"agents.llm.provider": "gemini", "agents.llm.model": "m"})
    with pytest.raises(SpecError, match="agents.llm.roles"):
        load_spec(None, {"agents.llm.provider": "openai", "agents.llm.model": "m", "agents.llm.roles": "judge"})


def test_missing_key_is_a_setup_error_naming_the_variable():
    llm = load_spec(None, {"agents.llm.provider": "anthropic", "agents.llm.model": "m"}).agents.llm
    with pytest.raises(LLMSetupError, match=r"\$ANTHROPIC_API_KEY is not set"):
        check_llm(llm, None, {})


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_valid_answer_parsed_and_recorded(provider, tmp_path):
    with ScriptedLLM() as s:
        s.script("ConfigProposal", ok(PROPOSAL, tokens=(300, 40)))
        c = client(provider, s.url, tmp_path, usd_per_mtok_input=3, usd_per_mtok_output=15)
        answer, calls = c.ask("orchestrator", "sys", "the view", ConfigProposal)
    assert answer.changes == {"fast_path": True} and answer.predicted_gain == 0.2
    body = s.requests[0]["body"]
    if provider == "openai":  # structured output by json_schema
        assert body["response_format"]["json_schema"]["schema"]["properties"]["action"]
        assert s.requests[0]["path"] == "/v1/chat/completions"
    else:  # by a forced tool call
        assert body["tool_choice"] == {"type": "tool", "name": "ConfigProposal"}
        assert body["tools"][0]["input_schema"]["properties"]["action"]
    assert calls == [{"n": 1, "role": "orchestrator", "attempt": 1, "model": "scripted", "input_tokens": 300,
                      "output_tokens": 40, "latency_s": calls[0]["latency_s"], "cost_usd": pytest.approx(0.0015),
                      "error": None}]
    rec = read_exchanges(tmp_path)
    assert len(rec) == 1 and json.loads(rec[0]["reply"]) == PROPOSAL and rec[0]["system"] == "sys"
    assert "sk-test" not in (tmp_path / EXCHANGES).read_text()  # never the key


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_one_repair_then_named_refusal(provider, tmp_path):
    with ScriptedLLM() as s:
        s.script("ConfigProposal", text("{not json"), ok(PROPOSAL),  # repaired
                 text('{"action": "jump"}'), ok({"action": "try_config"}))  # invalid twice
        c = client(provider, s.url, tmp_path)
        answer, calls = c.ask("orchestrator", "sys", "view", ConfigProposal)
        assert answer.action == "try_config" and [x["attempt"] for x in calls] == [1, 2]
        repair = s.requests[1]["body"]["messages"]
        assert repair[-2] == {"role": "assistant", "content": "{not json"} and "not valid" in repair[-1]["content"]
        with pytest.raises(LLMRefusal) as exc:
            c.ask("orchestrator", "sys", "view", ConfigProposal)
    assert exc.value.rule == "llm_schema_invalid" and "after one repair attempt" in exc.value.why
    assert len(exc.value.calls) == 2 and len(s.requests) == 4


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_retries_on_429_and_5xx_then_refuses(provider, tmp_path):
    with ScriptedLLM() as s:
        s.script("ConfigProposal", status(429), status(503), ok(PROPOSAL), status(500), status(500))
        c = client(provider, s.url, tmp_path, max_retries=2)
        answer, _ = c.ask("orchestrator", "sys", "view", ConfigProposal)  # the SDK retried twice
        assert answer.action == "try_config" and len(s.requests) == 3
        c2 = client(provider, s.url, tmp_path, max_retries=1)
        with pytest.raises(LLMRefusal) as exc:
            c2.ask("orchestrator", "sys", "view", ConfigProposal)
    assert exc.value.rule == "llm_http_error" and "HTTP 500" in exc.value.why and len(s.requests) == 5


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_timeout_is_a_named_refusal(provider, tmp_path):
    with ScriptedLLM() as s:
        s.script("ConfigProposal", slow(3.0, ok(PROPOSAL)))
        c = client(provider, s.url, tmp_path, timeout_s=0.3)
        with pytest.raises(LLMRefusal) as exc:
            c.ask("orchestrator", "sys", "view", ConfigProposal)
    assert exc.value.rule == "llm_timeout"
    assert read_exchanges(tmp_path)[0]["error"]["rule"] == "llm_timeout"


def test_budget_refuses_before_calling_and_survives_a_restart(tmp_path):
    with ScriptedLLM() as s:
        s.script("ConfigProposal", ok(PROPOSAL, tokens=(90, 20)), ok(PROPOSAL))
        c = client("openai", s.url, tmp_path, max_total_tokens=100)
        c.ask("orchestrator", "sys", "view", ConfigProposal)
        assert c.budget_reason().startswith("llm_budget: 110 of 100 LLM tokens")
        with pytest.raises(LLMRefusal, match="llm_budget"):
            c.ask("orchestrator", "sys", "view", ConfigProposal)
        again = client("openai", s.url, tmp_path, max_total_tokens=100)  # a resumed session reads the transcript
        assert again.budget_reason() is not None and len(s.requests) == 1


def test_replay_answers_in_recorded_order_then_is_exhausted(tmp_path):
    rec, new = tmp_path / "rec", tmp_path / "new"
    with ScriptedLLM() as s:
        s.script("ConfigProposal", text("garbage"), ok(PROPOSAL))
        c = client("anthropic", s.url, rec)
        c.ask("orchestrator", "sys", "view", ConfigProposal)
    r = LLMClient(c.llm, ReplayTransport(rec), new, replayed_from=str(rec))
    answer, calls = r.ask("orchestrator", "sys", "view", ConfigProposal)  # the repair replays too
    assert answer.changes == {"fast_path": True} and len(calls) == 2
    with pytest.raises(LLMRefusal, match="llm_replay_exhausted"):
        r.ask("orchestrator", "sys", "view", ConfigProposal)
    assert read_exchanges(new)[0]["replayed_from"] == str(rec)


EVIDENCE = {"changes": {"fast_path": True}, "protocol_verdict": "keep", "ratio": 1.2, "ci_low": 1.15, "ci_high": 1.25,
            "n_pairs": 5, "quality_passed": True, "quality_failed": [], "noise_floor": 0.01}


def test_critic_may_only_make_a_decision_stricter(tmp_path):
    with ScriptedLLM() as s:
        s.script("CriticRuling", ok({"decision": "keep", "lesson": "fine"}),
                 ok({"decision": "revert", "lesson": "too good for the roofline"}), text("nope"), text("nope"))
        c = client("openai", s.url, tmp_path)
        critic = LLMCritic(c, lambda: {"device": "cpu", "trials": []})
        slower = {**EVIDENCE, "protocol_verdict": "revert", "ratio": 0.9, "ci_low": 0.85, "ci_high": 0.95}
        assert critic.judge(slower)["decision"] == "revert" and not s.requests  # the LLM is not even asked
        assert critic.judge(EVIDENCE)["decision"] == "keep"
        stricter = critic.judge(EVIDENCE)
        assert stricter["decision"] == "revert" and stricter["lesson"].startswith("LLM critic: too good")
        failed = critic.judge(EVIDENCE)  # the LLM failed: the rules' ruling stands, the refusal named
        assert failed["decision"] == "keep" and failed["llm_refusal"]["rule"] == "llm_schema_invalid"
        assert "too good" not in json.dumps(s.requests[0]["body"])  # fresh: no earlier turns
