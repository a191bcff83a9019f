"""A Specialist as a command (``custom.patches.command``): a real session on
the custom kNN example where a script proposes patches one call at a time
(the example's real speed-up, then its correctness breaker, then nothing),
and one where the command fails."""

import json
import sys
import textwrap

import pytest
import yaml

from custom_helpers import ROOT, load_make_demo
from inferloom.agents.rules import RuleCritic, RuleOrchestrator, RuleRobustness
from inferloom.patches.source import CommandPatchSource, PatchSource, PatchSourceError
from inferloom.session import ledger as L
from inferloom.phases.runner import start
from inferloom.session.state import Phase
from inferloom.spec import load_spec

PATCHES = ROOT / "examples" / "custom" / "patches"

SPECIALIST = textwrap.dedent('''
    import json, os, sys
    state = json.load(sys.stdin)
    log, patches = sys.argv[1], sys.argv[2:]
    with open(log, "a") as f:
        f.write(json.dumps({"state": state, "id": os.environ["INFERLOOM_PATCH_ID"], "cwd": os.getcwd()}) + "\\n")
    n = len(state["patches_seen"])
    if n < len(patches):
        sys.stdout.write(open(patches[n]).read())
''')


def _agents():
    return {"orchestrator": RuleOrchestrator(seed=0), "critic_factory": RuleCritic, "robustness": RuleRobustness()}


def _spec(tmp_path, command, **custom):
    path = load_make_demo().make_demo(tmp_path / "demo", points=150, repeats=1, min_pairs=5, max_pairs=7)
    raw = yaml.safe_load(path.read_text())
    del raw["custom"]["patches"]["dir"]
    raw["custom"]["patches"]["command"] = command
    raw["custom"].update(custom)
    path.write_text(yaml.safe_dump(raw))
    return load_spec(path)


def test_command_source_conforms_and_reports_failures(tmp_path):
    src = CommandPatchSource([sys.executable, "-c", "import sys; sys.stdin.read()"])
    assert isinstance(src, PatchSource) and src.next_patch({"patches_seen": []}) is None  # nothing to say
    bad = CommandPatchSource([sys.executable, "-c", "import sys; sys.stderr.write('no idea'); sys.exit(3)"])
    with pytest.raises(PatchSourceError, match="exited with 3: no idea"):
        bad.next_patch({})
    slow = CommandPatchSource([sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=0.5)
    with pytest.raises(PatchSourceError, match="ran past 0.5 s"):
        slow.next_patch({})
    with pytest.raises(PatchSourceError, match="could not start"):
        CommandPatchSource([str(tmp_path / "no-such-program")]).next_patch({})
    # ids count the Specialist's own candidates (a directory's files come first, under their names)
    echo = CommandPatchSource([sys.executable, "-c",
                               "import sys; sys.stdin.read(); print('Title: t\\n--- a/x\\n+++ b/x')"])
    cand = echo.next_patch({"patches_seen": ["01-vectorize-distances", "specialist-01"]})
    assert cand.id == "specialist-02" and cand.title == "t" and cand.origin.startswith("command: ")


@pytest.mark.slow
def test_a_specialist_command_proposes_patches_through_the_same_gates(tmp_path):
    log = tmp_path / "specialist.jsonl"
    script = tmp_path / "specialist.py"
    script.write_text(SPECIALIST)
    # sandbox none: this Specialist logs what it saw to a file outside its directory, which the sandbox forbids
    # (tests/test_sandbox.py runs a sandboxed Specialist whose patch is kept)
    spec = _spec(tmp_path, [sys.executable, str(script), str(log), str(PATCHES / "01-vectorize-distances.patch"),
                            str(PATCHES / "02-approximate-search.patch")], sandbox="none")
    d = tmp_path / "session"
    st = start(d, spec, budget_minutes=10, max_trials=4, agents=_agents(), kb_url=None, sweep=False)
    assert st.phase == Phase.DONE
    patches = {e["id"]: e for e in L.read_entries(d) if e["kind"] == "patch"}
    assert patches["specialist-01"]["kept"] is True  # the real speed-up, measured and kept
    assert patches["specialist-02"]["kept"] is False and patches["specialist-02"]["rule"] == "quality_gate_failed"
    calls = [json.loads(x) for x in log.read_text().splitlines()]
    assert [c["id"] for c in calls] == ["specialist-01", "specialist-02", "specialist-03"]  # the third said nothing
    third = calls[2]["state"]
    assert third["patches_seen"] == ["specialist-01", "specialist-02"]
    assert [k["id"] for k in third["kept"]] == ["specialist-01"] and "def " in third["kept"][0]["diff"]
    assert {o["id"]: o["kept"] for o in third["outcomes"]} == {"specialist-01": True, "specialist-02": False}
    assert third["checkout"] == spec.custom.repo and third["objective"] == "queries_per_s"
    assert all(c["cwd"] != spec.custom.repo for c in calls)  # never run inside the user's checkout
    proposals = [e for e in L.read_entries(d) if e["kind"] == L.PROPOSAL and e.get("source") == "patch"]
    assert {p["agent"] for p in proposals} == {"specialist-command"}


@pytest.mark.slow
def test_a_failing_specialist_is_refused_once_and_the_session_goes_on(tmp_path):
    spec = _spec(tmp_path, [sys.executable, "-c", "import sys; sys.stderr.write('model unavailable'); sys.exit(2)"])
    d = tmp_path / "session"
    st = start(d, spec, budget_minutes=10, max_trials=2, agents=_agents(), kb_url=None, sweep=False)
    assert st.phase == Phase.DONE
    refusals = [e for e in L.read_entries(d) if e["kind"] == L.REFUSAL and e["rule"] == "patch_source_failed"]
    assert len(refusals) == 1 and "model unavailable" in refusals[0]["why"]
    assert st.used.trials >= 1  # the knob search went on without it
