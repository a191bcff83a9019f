"""The LLM Specialist on the custom kNN workload of examples/custom, through the
real openai SDK and the scripted localhost server: its patches go through the
same pipeline as a file's (a malformed answer is repaired once; a patch that
loosens the quality gate is refused with its rule; a real speed-up is measured
and kept by the protocol), and its calls are in the ledger and the report."""

import json

import pytest

from custom_helpers import ROOT, load_make_demo
from inferloom.session import ledger as L
from inferloom.phases.runner import start
from inferloom.spec import load_spec
from llm_scripted_server import ScriptedLLM, ok, text


def _proposal(name):
    raw = (ROOT / "examples/custom/patches" / name).read_text()
    head, _, diff = raw.partition("\ndiff --git")
    meta = dict(line.split(": ", 1) for line in head.splitlines() if ": " in line and not line.startswith(" "))
    return ok({"title": meta["Title"], "hypothesis": head.split("Hypothesis: ", 1)[1].split("Expected-Gain")[0],
               "expected_gain": 1.0, "diff": "diff --git" + diff})


@pytest.mark.slow
def test_llm_specialist_patches_go_through_the_patch_pipeline(tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_LLM_KEY", "k")
    spec_path = load_make_demo().make_demo(tmp_path / "demo", points=150, repeats=1, min_pairs=5, max_pairs=7)
    with ScriptedLLM() as s:
        s.script("PatchProposal", text("here is a patch"), _proposal("05-loosen-gate.patch"),  # repaired
                 _proposal("01-vectorize-distances.patch"))
        spec = load_spec(spec_path, {"agents.llm.provider": "openai", "agents.llm.model": "scripted",
                                     "agents.llm.base_url": f"{s.url}/v1", "agents.llm.api_key_env": "TEST_LLM_KEY",
                                     "agents.llm.max_retries": 0, "agents.llm.roles": "specialist"})
        d = tmp_path / "session"
        st = start(d, spec, budget_minutes=10, max_trials=1, kb_url=None, sweep=False, cycle_ceiling=1)
        assert not s.left()
        assert "kernel.py" in s.requests[0]["body"]["messages"][-1]["content"]  # shown the files it may change
    entries = L.read_entries(d)
    patches = {e["id"]: e for e in entries if e["kind"] == "patch"}
    assert patches["llm-01"]["rule"] == "touches_quality_gate" and not patches["llm-01"]["kept"]
    assert patches["llm-02"]["kept"] and st.extra.source.kept[0].id == "llm-02"
    assert st.stop_reason == "budget: 1 trials used"
    b = json.loads((d / "session_breakdown.json").read_text())
    assert b["llm"]["by_role"]["specialist"] == {"calls": 3, "input_tokens": 300, "output_tokens": 60, "errors": 0}
