"""The patch gates one by one: parse (a), policy (b), critic (c), the source
and its metadata, and the isolated worktree (d). Pure or git-only: fast."""

import os
from pathlib import Path

import pytest

from custom_helpers import ROOT, git, git_repo
from inferloom.patches.critic import RulePatchCritic
from inferloom.patches.parse import PatchRefusal, parse_patch
from inferloom.patches.policy import PatchPolicy, check_policy
from inferloom.patches.source import DirectoryPatchSource, PatchSource, read_metadata
from inferloom.patches.worktree import Workspace

EXAMPLES = ROOT / "examples" / "custom" / "patches"
POLICY = PatchPolicy(allowlist=("kernel.py", "*.md", "src/*"), entrypoint=("bench.py",), quality_gate=("gate.py",),
                     benchmark_inputs=("inputs.py", "data/"), forbidden_patterns=(r"\bsubprocess\b",))


def diff(path_a: str, path_b: str, body: str = "@@ -1 +1 @@\n-a\n+b\n", head: str = "") -> bytes:
    return (head + f"--- {path_a}\n+++ {path_b}\n" + body).encode()


def rule_of(data: bytes, policy: PatchPolicy = POLICY, tree: Path | None = None) -> str | None:
    try:
        check_policy(parse_patch(data), policy, tree)
    except PatchRefusal as r:
        return r.rule
    return None


def test_example_patches_meet_their_gates():
    src = DirectoryPatchSource(EXAMPLES)
    assert isinstance(src, PatchSource)
    got = {}
    for p in src.files():
        cand = src.load(p)
        try:
            parsed = parse_patch(cand.data)
            check_policy(parsed, POLICY)
            got[cand.id] = RulePatchCritic().review({"title": cand.title, "hypothesis": cand.hypothesis,
                                                     "paths": parsed.paths})["rule"]
        except PatchRefusal as r:
            got[cand.id] = r.rule
    assert got == {"01-vectorize-distances": None, "02-approximate-search": None,
                   "03-path-traversal": "path_traversal", "04-symlink": "symlink_created",
                   "05-loosen-gate": "touches_quality_gate", "06-binary-cache": "binary_content",
                   "07-malformed": "malformed_diff", "08-outside-hypothesis": "diff_outside_hypothesis"}


@pytest.mark.parametrize("data, rule", [
    (b"", "malformed_diff"),
    (b"just some text\n", "malformed_diff"),
    (b"--- a/kernel.py\n@@ -1 +1 @@\n", "malformed_diff"),  # no +++
    (diff("a/kernel.py", "b/kernel.py", "@@ -1,2 +1,2 @@\n-a\n+b\n"), "malformed_diff"),  # short hunk
    (diff("a/kernel.py", "b/kernel.py", "@@ -x +1 @@\n-a\n+b\n"), "malformed_diff"),
    (diff('"a/k\\303.py"', "b/k.py"), "malformed_diff"),
    (diff("a/kernel.py", "b/kernel.py") + b"\x00", "binary_content"),
    (diff("a/kernel.py", "b/kernel.py").replace(b"+b\n", b"+\xff\n"), "binary_content"),  # not UTF-8
    (b"diff --git a/x.bin b/x.bin\nBinary files a/x.bin and b/x.bin differ\n", "binary_content"),
])
def test_parse_refusals(data, rule):
    with pytest.raises(PatchRefusal) as exc:
        parse_patch(data)
    assert exc.value.rule == rule and exc.value.why


def test_parse_limits_and_a_good_diff():
    good = diff("a/kernel.py", "b/kernel.py", "@@ -1,2 +1,3 @@\n x\n-a\n+b\n+c\n\\ No newline at end of file\n",
                head="Title: t\n\n")
    p = parse_patch(good)
    assert p.paths == ["kernel.py"] and p.changed_lines == 3 and p.header == "Title: t"
    with pytest.raises(PatchRefusal, match="patch_too_large"):
        parse_patch(good, max_bytes=10)
    with pytest.raises(PatchRefusal, match="patch_too_large"):
        parse_patch(good, max_changed_lines=2)
    two = good + diff("a/src/a.py", "b/src/a.py")
    assert parse_patch(two).paths == ["kernel.py", "src/a.py"]
    with pytest.raises(PatchRefusal, match="patch_too_large"):
        parse_patch(two, max_files=1)


@pytest.mark.parametrize("a, b, rule", [
    ("/dev/null", "b//etc/cron.d/x", "absolute_path"),
    ("a/../../x.py", "b/../../x.py", "path_traversal"),
    ("a/src/../../x.py", "b/src/../../x.py", "path_traversal"),
    ("a/.git/hooks/pre-commit", "b/.git/hooks/pre-commit", "touches_git_metadata"),
    ("a/inferloom/session/close.py", "b/inferloom/session/close.py", "touches_inferloom"),
    ("a/bench.py", "b/bench.py", "touches_entrypoint"),
    ("a/gate.py", "b/gate.py", "touches_quality_gate"),
    ("a/data/points.csv", "b/data/points.csv", "touches_benchmark_inputs"),
    ("a/inputs.py", "b/inputs.py", "touches_benchmark_inputs"),
    ("a/setup.py", "b/setup.py", "outside_allowlist"),
    ("a/kernel.py", "b/gate.py", "touches_quality_gate"),  # a rename onto the gate
    ("a/kernel.py", "b/kernel.py", None),
    ("a/src/deep/mod.py", "b/src/deep/mod.py", None),
])
def test_policy_rules(a, b, rule):
    assert rule_of(diff(a, b)) == rule


def test_policy_forbidden_pattern_symlinks_and_empty_allowlist(tmp_path):
    assert rule_of(diff("a/kernel.py", "b/kernel.py", "@@ -1 +1 @@\n-a\n+import subprocess\n")) == "forbidden_pattern"
    link = (b"diff --git a/src/l b/src/l\nnew file mode 120000\n--- /dev/null\n+++ b/src/l\n@@ -0,0 +1 @@\n+/etc\n"
            b"\\ No newline at end of file\n")
    assert rule_of(link) == "symlink_created"
    # a path through an existing link in the tree is refused (the link is not followed)
    (tmp_path / "src").mkdir()
    os.symlink("/tmp", tmp_path / "src" / "out")
    assert rule_of(diff("a/src/out/x.py", "b/src/out/x.py"), tree=tmp_path) == "symlink_followed"
    assert rule_of(diff("a/src/x.py", "b/src/x.py"), tree=tmp_path) is None
    assert rule_of(diff("a/kernel.py", "b/kernel.py"), PatchPolicy()) == "outside_allowlist"


def test_critic_rules():
    c = RulePatchCritic()
    assert c.review({"title": "t", "hypothesis": "", "paths": ["kernel.py"]})["rule"] == "no_hypothesis"
    r = c.review({"title": "t", "hypothesis": "kernel.py loops", "paths": ["kernel.py", "src/util.py"]})
    assert r["decision"] == "refuse" and r["rule"] == "diff_outside_hypothesis" and "src/util.py" in r["why"]
    assert c.review({"title": "speed up util.py", "hypothesis": "kernel.py loops",
                     "paths": ["kernel.py", "src/util.py"]})["decision"] == "sign_off"


def test_metadata_header_and_sidecar(tmp_path):
    m = read_metadata(b"Subject: [PATCH 1/2] faster\nHypothesis: a.py does\n  twice the work\n"
                      b"Expected-Gain: +12.5%\n\n--- a/a.py\n")
    assert m == {"title": "faster", "hypothesis": "a.py does twice the work", "expected_gain": 0.125}
    (tmp_path / "x.patch").write_bytes(b"Title: header\n--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-a\n+b\n")
    (tmp_path / "x.yaml").write_text("title: sidecar\nhypothesis: a.py\nexpected_gain: 0.2\n")
    (tmp_path / "notes.txt").write_text("ignored")
    src = DirectoryPatchSource(tmp_path)
    cand = src.next_patch({"patches_seen": []})
    assert (cand.id, cand.title, cand.hypothesis, cand.expected_gain) == ("x", "sidecar", "a.py", 0.2)
    assert src.next_patch({"patches_seen": ["x"]}) is None


def test_worktree_apply_commit_and_isolation(tmp_path):
    user = git_repo(tmp_path / "user", {"kernel.py": "a\n", "gate.py": "g\n"})
    head = git("rev-parse", "HEAD", cwd=user).strip()
    ws = Workspace(tmp_path / "ws", user, date=1_700_000_000)
    tree = ws.apply("candidate", head, "p1", "--- a/kernel.py\n+++ b/kernel.py\n@@ -1 +1 @@\n-a\n+b\n")
    (tree / "junk.out").write_text("a run wrote this")  # never committed: only the patch is staged
    sha = ws.commit("candidate", "inferloom KEEP p1: t (+1.0% [+0.5, +1.5])")
    assert git("show", "--name-only", "--format=", sha, cwd=ws.repo).split() == ["kernel.py"]
    # deterministic: the same patch on the same base gives the same commit
    ws.apply("candidate", head, "p1", "--- a/kernel.py\n+++ b/kernel.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert ws.commit("candidate", "inferloom KEEP p1: t (+1.0% [+0.5, +1.5])") == sha
    with pytest.raises(PatchRefusal, match="does_not_apply"):
        ws.apply("candidate", head, "p2", "--- a/kernel.py\n+++ b/kernel.py\n@@ -1 +1 @@\n-zzz\n+b\n")
    ws.publish("inferloom/s1", sha)
    assert git("rev-parse", "inferloom/s1", cwd=user).strip() == sha
    assert git("rev-parse", "HEAD", cwd=user).strip() == head and git("status", "--porcelain", cwd=user) == ""
    assert (user / "kernel.py").read_text() == "a\n"
    rb = ws.revert("rollback", sha, [sha])
    assert ws.tree_id(rb) == ws.tree_id(head)
    ws.remove("candidate")
    assert not (tmp_path / "ws" / "trees" / "candidate").exists()
