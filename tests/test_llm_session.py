"""Whole sessions on the synthetic workload driven by a scripted LLM on
localhost, through the real SDKs: the LLM's proposals go through the same gates
(an unknown knob and a malformed answer are refused with named rules, a valid
one is measured and kept only by the protocol), every exchange is recorded
with the session, the report counts tokens and cost per kept gain, a
recorded session replays without the server (``--llm-replay``), and the token
limit stops the search with stop reason ``llm_budget``."""

import json

import pytest

from inferloom.agents.llm_record import read_exchanges
from inferloom.cli import main
from inferloom.phases.runner import start
from inferloom.session import ledger as L
from inferloom.spec import load_spec
from inferloom.workloads.base import Knob
from inferloom.verify import verify_session
from inferloom.workloads.synthetic import SyntheticAdapter
from llm_scripted_server import ScriptedLLM, ok, status, text

KNOBS = [Knob("fast_path", "bool", False, "synthetic +20%"), Knob("useless", "bool", False, "synthetic 0%")]
BASE = {"model": "llama-tiny", "framework": "synthetic", "device": "cpu", "protocol.bootstrap_resamples": 999,
        "quality.eval_prompts": 4, "quality.heldout_prompts": 4, "quality.prompt_len": 8,
        "quality.continuation_len": 8}


def adapter():
    return SyntheticAdapter(effects={"fast_path": {True: 1.20}, "useless": {True: 1.0}}, numerics={}, knobs=KNOBS,
                            noise_sd=0.02)


def spec(url, **kw):
    return load_spec(None, {**BASE, "agents.llm.provider": "openai", "agents.llm.model": "scripted",
                            "agents.llm.base_url": f"{url}/v1", "agents.llm.api_key_env": "TEST_LLM_KEY",
                            "agents.llm.max_retries": 0, "agents.llm.usd_per_mtok_input": 3,
                            "agents.llm.usd_per_mtok_output": 15, **{f"agents.llm.{k}": v for k, v in kw.items()}})


def proposal(changes, action="try_config"):
    return ok({"action": action, "changes": changes, "predicted_gain": 0.1 if changes else None,
               "rationale": "scripted"})


def run(d, sp, **kw):
    return start(d, sp, budget_minutes=10, max_trials=6, adapter=adapter(), cycle_ceiling=1, sweep=False,
                 kb_url=None, **kw)


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("TEST_LLM_KEY", "sk-test-not-a-real-key")


def test_llm_session_goes_through_the_gates_is_recorded_and_replays(tmp_path):
    d, r = tmp_path / "llm", tmp_path / "replay"
    with ScriptedLLM() as s:
        s.script("ConfigProposal", proposal({"fast_path": True}), proposal({"turbo": True}),
                 text("sure! fast_path on"), text("{still not json"), proposal({"useless": True}),
                 proposal({}, "end_phase"))
        s.script("CriticRuling", *[ok({"decision": "keep", "lesson": "consistent with the profile"})] * 3)
        st = run(d, spec(s.url))
        assert s.left().get("ConfigProposal") is None  # every scripted proposal was asked for
    assert [t.changes for t in st.trials] == [{"fast_path": True}, {"useless": True}]
    assert st.trials[0].kept and st.trials[0].agent == "llm-orchestrator" and st.stack["fast_path"] is True
    assert not st.trials[1].kept
    entries = L.read_entries(d)
    refused = [(e["rule"], e["agent"]) for e in entries if e["kind"] == L.REFUSAL]
    assert ("unknown_knob", "llm-orchestrator") in refused and ("llm_schema_invalid", "llm-orchestrator") in refused
    critic = [e for e in entries if e["kind"] == L.AGENT_IO and e.get("role") == "critic"]
    assert critic[0]["agent"] == "llm-critic" and critic[0]["output"]["llm_calls"][0]["role"] == "critic"
    b = json.loads((d / "session_breakdown.json").read_text())
    assert b["llm"]["by_role"]["orchestrator"]["calls"] == 6  # 5 answers asked for, one with its repair attempt
    assert b["llm"]["cost_usd"] == pytest.approx(b["llm"]["calls"] * (100 * 3 + 20 * 15) / 1e6)
    assert b["llm"]["kept_gain_pct"] > 10 and b["llm"]["cost_usd_per_gain_pct"] > 0
    assert "## LLM agents" in (d / "report.md").read_text()
    assert set(b["llm"]["refusals_by_rule"]) == {"unknown_knob", "llm_schema_invalid"}
    assert "Refusals of the LLM agents' outputs by rule: llm_schema_invalid x1" in (d / "report.md").read_text()
    assert main(["report", str(d), "--html", "--out", str(tmp_path / "r.html")]) == 0
    html = (tmp_path / "r.html").read_text()
    assert '<section id="llm"><h2>LLM agents</h2>' in html and "<code>unknown_knob</code>" in html
    findings = verify_session(d)  # the LLM's session verifies like any other
    assert findings.checks and all(c.ok for c in findings.checks)
    recorded = read_exchanges(d)
    assert len(recorded) == b["llm"]["calls"] and all("sk-test" not in json.dumps(x) for x in recorded)

    # replay: the recorded replies answer, no server, no key needed
    st2 = run(r, spec("http://127.0.0.1:9"), llm_replay=str(d))
    assert [t.changes for t in st2.trials] == [t.changes for t in st.trials]
    assert [t.kept for t in st2.trials] == [t.kept for t in st.trials]
    assert all(x["replayed_from"] == str(d) for x in read_exchanges(r))
    assert load_spec(None, BASE).agents.llm is None  # nothing of this leaks into the default


def test_llm_token_limit_stops_the_search_with_llm_budget(tmp_path):
    with ScriptedLLM() as s:
        s.script("ConfigProposal", proposal({"fast_path": True}), proposal({"useless": True}))
        st = run(tmp_path / "s", spec(s.url, max_total_tokens=150, roles="orchestrator"))
    # 120 tokens after the first call (under 150): a second call; 240 after it: the search stops
    assert st.stop_reason.startswith("llm_budget: 240 of 150 LLM tokens used")
    assert len(st.trials) == 2


def test_cli_llm_replay_of_a_session_without_llm_is_refused(tmp_path, capsys):
    d = tmp_path / "plain"
    start(d, load_spec(None, BASE), budget_minutes=5, max_trials=1, adapter=adapter(), cycle_ceiling=1, sweep=False,
          kb_url=None)
    code = main(["optimize", "--framework", "synthetic", "--device", "cpu", "--llm-replay", str(d),
                 "--out", str(tmp_path / "new"), "--quiet", "--no-kb"])
    assert code == 2 and "ran without agents.llm" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()



@pytest.mark.parametrize("replies, rule", [((text("keep it!"), text("{not json")), "llm_schema_invalid"),
                                           ((status(500, None),), "llm_http_error")])
def test_a_failing_llm_critic_is_a_refusal_and_the_protocols_decision_stands(tmp_path, replies, rule):
    d = tmp_path / "s"
    with ScriptedLLM() as s:  # garbage twice (the answer and its repair attempt), or a server error
        s.script("CriticRuling", *replies)
        st = start(d, spec(s.url, roles="critic"), budget_minutes=10, max_trials=2, adapter=adapter(),
                   cycle_ceiling=1, sweep=False, kb_url=None)
        assert not s.left()
    kept = [t for t in st.trials if t.changes == {"fast_path": True}]
    assert kept and kept[0].kept and st.stack["fast_path"] is True  # the rules' keep stands
    refused = [e for e in L.read_entries(d) if e["kind"] == L.REFUSAL and e["agent"] == "llm-critic"]
    assert [e["rule"] for e in refused] == [rule]
    assert "the decision stands" in refused[0]["why"] and refused[0]["output"]["decision"] == "keep"
    assert f"refused ({rule}) from llm-critic" in (d / "report.md").read_text()
