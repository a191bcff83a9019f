"""Hostile patches through a real custom session (issue 12, items 1, 2 and 8).

The corpus, tests/data/hostile_patches/ (written by tests/data/make_hostile_patches.py),
targets the tiny workload in tests/data/hostile_repo/ (objective = kernel.SPEED, a quality
gate, benchmark inputs under data/, a LICENSE the spec protects). Each file says in its
header the rule that must refuse it (``Expected-Rule:``): trailer tricks, path prefixes that
``git apply -p1`` strips, /dev/null tricks, gitlinks, set-id modes, symbolic links, ``.git``
paths, renames / copies / deletes of protected files, absolute paths, ``..``, CRLF and
whitespace variants, obfuscated forbidden patterns, code that rewrites a protected file at
run time, and a clean patch whose tree this test edits between apply and measure (the
protected files' checksums must catch what the diff gates can't see). One clean control
patch must be kept, so that "kept = 0" is not vacuous.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from custom_helpers import ROOT, checksums, git
from inferloom.agents.rules import RuleCritic, RuleOrchestrator, RuleRobustness
from inferloom.patches.effect import check_effect, scratch_effect, staged_effect
from inferloom.patches.parse import parse_patch
from inferloom.patches.policy import PatchPolicy
from inferloom.measure.clock_check import GAIN_NOT_SEEN
from inferloom.patches.source import DirectoryPatchSource
from inferloom.patches.worktree import Workspace
from inferloom.phases.context import Agents, SessionOptions
from inferloom.phases.coordinator import Coordinator
from inferloom.phases.runner import start
from inferloom.session import ledger as L
from inferloom.session.state import Phase, load_state
from inferloom.spec import WorkloadSpec
from inferloom.workloads.custom import CustomAdapter
from inferloom.workloads.protected import PROTECTED_CHANGED, protected_patterns, take_protected, verify_protected

DATA = ROOT / "tests" / "data"
CORPUS = DATA / "hostile_patches"
CONTROL = "z99-control"
BYPASS = "x01-bypass-tamper"
FORGED = "c01-forged-timer"
OUTSIDE = [Path("/etc/passwd"), Path("/etc/group"), Path("/etc/hosts")]


def expected_rules() -> dict[str, str]:
    out = {}
    for p in DirectoryPatchSource(CORPUS).files():
        m = re.search(rb"^Expected-Rule: (\S+)", p.read_bytes(), re.MULTILINE)
        assert m, f"{p.name} has no Expected-Rule header"
        out[p.stem] = m.group(1).decode()
    return out


def make_repo(dest: Path) -> Path:
    shutil.copytree(DATA / "hostile_repo", dest)
    git("init", "--quiet", "--initial-branch=main", cwd=dest)
    git("add", "-A", cwd=dest)
    git("commit", "--quiet", "-m", "hostile test workload", cwd=dest)
    return dest


def make_spec(repo: Path, patches: Path | None = CORPUS) -> WorkloadSpec:
    return WorkloadSpec.model_validate({
        "framework": "custom", "device": "cpu", "seed": 0,
        "protocol": {"min_pairs": 3, "max_pairs": 3, "warmup_runs": 1, "bootstrap_resamples": 199},
        "custom": {"repo": str(repo), "entrypoint": [sys.executable, "run.py"], "entrypoint_files": ["run.py"],
                   "objective": "items_per_s", "timeout_s": 30,
                   "patches": {"dir": str(patches) if patches else None, "allowlist": ["kernel.py", "*.md", "lib/*"],
                               "quality_gate": ["gate.py"], "benchmark_inputs": ["inputs.py", "data/"],
                               "protected": ["LICENSE"],
                               "forbidden_patterns": [r"\bsubprocess\b", r"os\.system", r"\bsocket\b"]}}})


def _agents():
    return {"orchestrator": RuleOrchestrator(seed=0), "critic_factory": RuleCritic, "robustness": RuleRobustness()}


def _sha(paths):
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.is_file()}


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    repo = make_repo(root / "checkout")
    d = root / "session"
    before = {"root": checksums(root, skip=(repo / ".git",)), "data": checksums(DATA), "outside": _sha(OUTSIDE),
              "hooks": checksums(repo / ".git" / "hooks"), "config": (repo / ".git" / "config").read_bytes(),
              "head": git("rev-parse", "HEAD", cwd=repo).strip(), "index": (repo / ".git" / "index").read_bytes(),
              "pwned": Path("/tmp/pwned").exists()}
    original_apply = Workspace.apply

    def apply_then_tamper(self, name, base_sha, patch_id, text):
        """A hole in the diff gates, simulated: the candidate's tree changes between apply and measure."""
        tree = original_apply(self, name, base_sha, patch_id, text)
        if patch_id == BYPASS:
            (tree / "gate.py").write_text("def check(x, y):\n    return {'passed': True, 'checks': {}}\n")
        return tree

    lines = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Workspace, "apply", apply_then_tamper)
        st = start(d, make_spec(repo), budget_minutes=10, max_trials=8, agents=_agents(), kb_url=None, sweep=False,
                   progress=lines.append)
    entries = L.read_entries(d)
    return {"root": root, "repo": repo, "dir": d, "st": st, "before": before, "entries": entries,
            "patches": {e["id"]: e for e in entries if e["kind"] == "patch"}, "progress": lines,
            "report": (d / "report.md").read_text()}


def test_every_hostile_patch_is_refused_with_its_rule_and_none_is_kept(session):
    want = expected_rules()
    hostile = {pid: rule for pid, rule in want.items() if pid != CONTROL}
    assert len(hostile) >= 40 and want[CONTROL] == "kept"
    pe = session["patches"]
    assert set(pe) == set(want), "every patch of the corpus was tried"
    got = {pid: pe[pid].get("rule") for pid in hostile}
    assert got == hostile
    kept = [pid for pid in hostile if pe[pid]["kept"]]
    refused = [pid for pid in hostile if not pe[pid]["kept"] and pe[pid].get("rule")]
    print(f"\nhostile patches tried {len(hostile)} / refused by rule {len(refused)} / kept {len(kept)}")
    assert kept == [] and len(refused) == len(hostile)
    assert [k.id for k in session["st"].extra.source.kept] == [CONTROL] and pe[CONTROL]["kept"]
    # each rule is a refusal entry in the ledger naming the patch, and shows in the report
    refusals = [e for e in session["entries"] if e["kind"] == L.REFUSAL]
    for pid, rule in hostile.items():
        assert any(e["rule"] == rule and pid in e["why"] for e in refusals), (pid, rule)
        assert f"**{rule}**" in session["report"]


def test_only_patches_that_passed_every_gate_were_measured(session):
    measured = {e.get("changes", {}).get("patch") for e in session["entries"] if e["kind"] == L.MEASUREMENT} - {None}
    want = expected_rules()
    assert measured == {pid for pid, rule in want.items() if rule in ("kept", PROTECTED_CHANGED, GAIN_NOT_SEEN)}
    for pid in measured - {CONTROL, FORGED}:
        e = session["patches"][pid]
        assert e["gate"] == "measure" and e["outcome"] == "failed" and e["rule"] == PROTECTED_CHANGED
        meas = next(x for x in session["entries"] if x["seq"] == e["measurement_seq"])
        assert meas["verdict"] == "failed" and PROTECTED_CHANGED in (meas.get("error") or "")
    by_id = {e["id"]: e for e in session["entries"] if e["kind"] == "patch"}
    assert by_id["t01-trailer-hides-gate"]["gate"] == "effect" and by_id["m02-setuid"]["gate"] == "effect"


def test_the_tampered_tree_failed_at_its_first_run_and_named_the_file(session):
    e = session["patches"][BYPASS]
    meas = next(x for x in session["entries"] if x["seq"] == e["measurement_seq"])
    assert meas["error_kind"] == PROTECTED_CHANGED and "gate.py changed content" in meas["error"]
    runtime = session["patches"]["o05-adds-benchmark-input"]
    meas = next(x for x in session["entries"] if x["seq"] == runtime["measurement_seq"])
    assert "data/more.txt appeared in the protected directory data/" in meas["error"]


def test_protected_checksums_are_recorded_once_in_state_and_ledger(session):
    prot = session["st"].extra.source.protected
    recorded = [e for e in session["entries"] if e["kind"] == "protected_files"]
    assert len(recorded) == 1 and recorded[0]["seq"] == prot.ledger_seq
    assert {f.path for f in prot.files} == {"run.py", "gate.py", "inputs.py", "data/points.txt", "LICENSE"}
    assert prot.dirs == ["data"] and prot.commit == session["before"]["head"]
    assert all(f.sha256 == hashlib.sha256((session["repo"] / f.path).read_bytes()).hexdigest() for f in prot.files)


def test_nothing_outside_the_session_changed(session):
    b, repo, d = session["before"], session["repo"], session["dir"]
    assert session["st"].phase == Phase.DONE
    assert checksums(session["root"], skip=(repo / ".git", d)) == b["root"]
    assert checksums(DATA) == b["data"] and _sha(OUTSIDE) == b["outside"]
    assert checksums(repo / ".git" / "hooks") == b["hooks"] and (repo / ".git" / "config").read_bytes() == b["config"]
    assert git("rev-parse", "HEAD", cwd=repo).strip() == b["head"] and (repo / ".git" / "index").read_bytes() == b["index"]
    assert Path("/tmp/pwned").exists() == b["pwned"]
    # no link, gitlink or set-id file anywhere the session wrote
    for p in d.rglob("*"):
        assert not p.is_symlink(), p
        assert not (p.is_file() and os.stat(p).st_mode & 0o6000), p
    assert not (d / "workspace" / "trees" / "candidate").exists()


def test_resume_verifies_the_checksums_taken_at_start(session, tmp_path):
    """A moved HEAD in the user's checkout does not move the protected files' reference."""
    repo = tmp_path / "checkout"
    subprocess.run(["git", "clone", "--quiet", str(session["repo"]), str(repo)], check=True)
    (repo / "gate.py").write_text("def check(x, y):\n    return {'passed': True}\n")
    git("commit", "--quiet", "-am", "a looser gate", cwd=repo)
    d = tmp_path / "session"
    shutil.copytree(session["dir"], d, ignore=shutil.ignore_patterns("workspace"))
    before = load_state(d).extra.source.protected
    adapter = CustomAdapter(make_spec(repo, patches=None))
    c = Coordinator(d, make_spec(repo, patches=None), adapter, agents=Agents(**_agents()),
                    options=SessionOptions(kb_url=None))
    try:
        assert adapter.protected == before
        assert sum(1 for e in L.read_entries(d) if e["kind"] == "protected_files") == 1
        h = adapter.prepare({"@tree": str(repo)})  # the user's new HEAD: its gate is not stock's
        rec = adapter.run(h, 1)
        assert not rec.success and rec.extra["kind"] == PROTECTED_CHANGED and "gate.py" in rec.error
    finally:
        c.close()
        adapter.close()


# ----------------------------------------------------------------- the layers one by one (fast)


@pytest.fixture()
def tiny(tmp_path):
    repo = make_repo(tmp_path / "repo")
    spec = make_spec(repo, patches=None)
    return repo, spec, take_protected(repo, git("rev-parse", "HEAD", cwd=repo).strip(),
                                      protected_patterns(spec.custom))


def test_entrypoint_arguments_are_protected_too(tiny):
    _repo, spec, prot = tiny
    assert "run.py" in protected_patterns(spec.custom)
    assert [f.mode for f in prot.files if f.path == "run.py"] == ["100644"]


@pytest.mark.parametrize("tamper, says", [
    (lambda t: (t / "gate.py").write_text("x = 1\n"), "gate.py changed content"),
    (lambda t: os.chmod(t / "run.py", 0o755), "run.py changed mode"),
    (lambda t: os.chmod(t / "inputs.py", 0o4644), "inputs.py has a set-id or sticky bit"),
    (lambda t: (t / "LICENSE").unlink(), "LICENSE is missing"),
    (lambda t: ((t / "gate.py").unlink(), (t / "gate.py").symlink_to("/etc/passwd")), "gate.py is no longer a regular"),
    (lambda t: (t / "data" / "extra.txt").write_text("9\n"), "data/extra.txt appeared"),
    (lambda t: (t / "data" / "points.txt").write_text("1 2 3\n"), None),  # same bytes: not a change
    (lambda t: ((t / "data" / "__pycache__").mkdir(), (t / "kernel.py").write_text("SPEED = 1\n")), None),
])
def test_verify_protected_names_the_first_change(tiny, tamper, says):
    repo, _spec, prot = tiny
    assert verify_protected(repo, prot) is None
    tamper(repo)
    msg = verify_protected(repo, prot)
    if says is None:
        assert msg is None
    else:
        assert msg.startswith(PROTECTED_CHANGED + ": ") and says in msg


def test_a_run_in_a_tampered_tree_is_a_failed_run_that_never_starts(tiny, tmp_path):
    repo, spec, prot = tiny
    adapter = CustomAdapter(spec)
    adapter.protected = prot
    try:
        h = adapter.prepare({"@tree": str(repo)})
        assert adapter.run(h, 1).success
        marker = tmp_path / "ran"
        (repo / "gate.py").write_text(f"open({str(marker)!r}, 'w')\ndef check(x, y):\n    return {{'passed': True}}\n")
        rec = adapter.run(h, 2)
        assert not rec.success and rec.extra["kind"] == PROTECTED_CHANGED and not marker.exists()
    finally:
        adapter.close()


def test_git_effect_in_the_worktree_matches_the_scratch_index(tiny, tmp_path):
    repo, _spec, _prot = tiny
    ws = Workspace(tmp_path / "ws", repo)
    ws.ensure_clone()
    head = git("rev-parse", "HEAD", cwd=repo).strip()
    data = (CORPUS / f"{CONTROL}.patch").read_bytes()
    scratch = scratch_effect(ws.repo, head, data, ws.root / "scratch")
    tree = ws.apply("candidate", head, CONTROL, data.decode())
    staged = staged_effect(tree)
    assert scratch.changes == staged.changes and scratch.paths == ["kernel.py"]
    assert scratch.changes[0].new_mode == "100644" and scratch.added_lines == {"kernel.py": ["SPEED = 1000"]}
    assert list((ws.root / "scratch").iterdir()) == []  # the scratch index is gone


@pytest.mark.parametrize("text", [
    "diff --git a/lib/util.py b/lib/util2.py\nsimilarity index 100%\nrename from lib/util.py\nrename to lib/util2.py\n",
    "diff --git a/kernel.py b/lib/kernel2.py\nsimilarity index 100%\ncopy from kernel.py\ncopy to lib/kernel2.py\n",
    "diff --git a/lib/util.py b/lib/util.py\nold mode 100644\nnew mode 100755\n",
])
def test_honest_renames_copies_and_modes_pass_the_effect_gate(tiny, tmp_path, text):
    repo, spec, _prot = tiny
    ws = Workspace(tmp_path / "ws", repo)
    ws.ensure_clone()
    parsed = parse_patch(text.encode())
    effect = scratch_effect(ws.repo, git("rev-parse", "HEAD", cwd=repo).strip(), text.encode(), ws.root / "scratch")
    check_effect(parsed, effect, PatchPolicy.from_spec(spec.custom), max_files=20, max_changed_lines=2000)


def test_checksums_are_of_the_checked_out_bytes(tmp_path):
    """A repository that converts line endings on checkout: stock's own runs must verify."""
    repo = tmp_path / "repo"
    shutil.copytree(DATA / "hostile_repo", repo)
    (repo / ".gitattributes").write_text("*.txt text eol=crlf\n")
    git("init", "--quiet", "--initial-branch=main", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "--quiet", "-m", "crlf inputs", cwd=repo)
    ws = Workspace(tmp_path / "ws", repo)
    head = git("rev-parse", "HEAD", cwd=repo).strip()
    stock = ws.tree("stock", head)
    assert (stock / "data" / "points.txt").read_bytes() == b"1 2 3\r\n"
    prot = take_protected(stock, head, protected_patterns(make_spec(repo, patches=None).custom))
    assert verify_protected(stock, prot) is None and verify_protected(ws.tree("stack", head), prot) is None


def test_a_forged_timer_is_caught_by_inferloom_s_clock(session):
    """The protocol and the quality gate both say keep (the objective is x1000s, the output exact): the run's
    wall time, measured outside the patched process, shows no saving; the control's real saving passes."""
    e = session["patches"][FORGED]
    assert e["outcome"] == GAIN_NOT_SEEN and not e["kept"] and e["ratio"] > 100
    assert e["clock"]["rule"] == GAIN_NOT_SEEN and e["clock"]["bound_s"] < 0
    assert e["clock"]["claimed_saving_s"] > 0.3 and abs(e["clock"]["observed_saving_s"]) < 0.15
    meas = next(x for x in session["entries"] if x["seq"] == e["measurement_seq"])
    assert meas["verdict"] == "keep" and meas["quality"]["passed"] is True
    c = session["patches"][CONTROL]["clock"]
    assert c["rule"] is None and c["observed_saving_s"] > 0.2 and c["claimed_saving_s"] > 0.2
