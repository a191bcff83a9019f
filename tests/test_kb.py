"""Recipe KB: strict writes, relaxed lookup, drift, export/import, concurrency, errors."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from inferloom.kb import (
    DRIFT_FACTOR, KEY_FIELDS, TIERS, KBError, RecipeStore, WorkloadKey, default_kb_url, format_lookup,
)
from inferloom.kb.db import SCHEMA_VERSION
from inferloom.report.breakdown import breakdown_from_ledger
from inferloom.session.atomic import write_json_atomic
from inferloom.session.ledger import read_entries
from inferloom.session.manifest import read_manifest
from inferloom.session.state import load_state

KEY = WorkloadKey(model="llama-3.1-8b", hardware="NVIDIA H200", framework="transformers", model_type="llama",
                  architecture="LlamaForCausalLM", framework_version="5.24.0", precision="bfloat16")
STOCK = {"compile_mode": "off", "cache_implementation": "dynamic", "sdpa_backend": "auto"}


def breakdown(ratio=1.30, verdict="keep", quality=True, final=True, changes=None, rejected=True):
    """A session_breakdown.json as inferloom.report.breakdown.breakdown_from_ledger writes it."""
    changes = {"compile_mode": "default"} if changes is None else changes
    b = {"schema_version": 1, "stock_config": dict(STOCK), "final_config": {**STOCK, **changes},
         "stop_reason": "converged",
         "action_path": [{"trial": 1, "cycle": 1, "changes": changes, "ratio": ratio, "ci_low": ratio - 0.1,
                          "ci_high": ratio + 0.1, "lesson": f"{changes}: kept", "quality_passed": True,
                          "ledger_seq": 7}],
         "rejected": [{"trial": 2, "changes": {"cache_implementation": "static"}, "outcome": "revert",
                       "ratio": 0.84, "ci_low": 0.80, "ci_high": 0.87, "lesson": "static cache: slower",
                       "ledger_seq": 12}] if rejected else [],
         "refusals": [{"rule": "pinned_knob", "why": "touches a pinned knob", "agent": "rules", "ledger_seq": 3}]}
    if final:
        b["final"] = {"objective_median": 1000.0 * ratio, "stock_median_same_run": 1000.0, "ratio": ratio,
                      "ci_low": ratio - 0.05, "ci_high": ratio + 0.05, "n_pairs": 7, "protocol_verdict": verdict,
                      "quality_passed": quality, "quality_failed": [] if quality else ["mean_kl"], "ledger_seq": 24}
    else:
        b["final"] = {"ratio": 1.0, "note": "nothing was kept: the final stack is stock"}
        b["final_config"] = dict(STOCK)
    return b


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    """The same tests on both backends: a SQLite file, and a fresh database on the throwaway PostgreSQL cluster."""
    url = (f"sqlite:///{tmp_path / 'kb.sqlite'}" if request.param == "sqlite"
           else request.getfixturevalue("pg_cluster").new_database())
    with RecipeStore(url) as s:
        yield s


# --------------------------------------------------------------------------- strict writes
def test_validated_session_enters_a_winner(store):
    res = store.record_session(KEY, breakdown(1.30), "s1")
    assert res.winner_entered and res.validated and res.rule == "keep" and res.recipe_id
    r = store.show(KEY)
    assert r.status == "ok" and r.session_ids == ["s1"]
    w = r.winner
    assert w["changes"] == {"compile_mode": "default"} and w["config"]["compile_mode"] == "default"
    assert (w["ratio"], w["ci_low"], w["ci_high"]) == pytest.approx((1.30, 1.25, 1.35))
    assert (w["stock_objective"], w["final_objective"]) == pytest.approx((1000.0, 1300.0))
    assert w["session_id"] == "s1" and w["evidence"]["protocol_verdict"] == "keep"
    assert [x["changes"] for x in r.worked] == [{"compile_mode": "default"}]
    assert {(tuple(f["changes"].items()), f["rule"]) for f in r.failed} == {
        ((("cache_implementation", "static"),), "revert"), ((), "pinned_knob")}
    assert any("static cache" in les["text"] for les in r.lessons)


@pytest.mark.parametrize("kwargs, rule", [
    ({"quality": False}, "final-quality-failed"),
    ({"quality": None}, "final-quality-unscored"),
    ({"verdict": "inconclusive"}, "final-inconclusive"),
    ({"final": False}, "no-final-comparison"),
])
def test_unvalidated_session_adds_lessons_and_failures_but_no_winner(store, kwargs, rule):
    res = store.record_session(KEY, breakdown(1.30, **kwargs), "bad")
    assert not res.winner_entered and not res.validated and res.rule == rule
    r = store.show(KEY)
    assert r.winner is None and r.worked == [] and r.session_ids == ["bad"]
    assert r.sessions[0]["rule"] == rule and r.lessons
    rules = {f["rule"] for f in r.failed}
    assert {"revert", "pinned_knob"} <= rules
    if kwargs.get("final", True):  # the final stack itself failed: remembered as a failure with its rule
        assert any(f["rule"] == rule and f["changes"] == {"compile_mode": "default"} for f in r.failed)
    assert store.lookup(KEY).chosen is None


def test_failed_session_never_removes_a_winner_and_only_a_better_ratio_replaces(store):
    store.record_session(KEY, breakdown(1.30), "s1")
    assert not store.record_session(KEY, breakdown(1.90, quality=False), "s2").winner_entered
    worse = store.record_session(KEY, breakdown(1.20, changes={"sdpa_backend": "flash"}), "s3")
    assert worse.validated and not worse.winner_entered and "better" in worse.reason
    assert store.show(KEY).winner["session_id"] == "s1"
    better = store.record_session(KEY, breakdown(1.50, changes={"sdpa_backend": "math"}), "s4")
    assert better.winner_entered
    r = store.show(KEY)
    assert r.winner["session_id"] == "s4" and r.winner["changes"] == {"sdpa_backend": "math"}
    assert r.session_ids == ["s1", "s2", "s3", "s4"]          # history of every session
    assert [s["winner_entered"] for s in r.sessions] == [True, False, False, True]
    again = store.record_session(KEY, breakdown(9.0), "s4")     # a resumed CLOSE records again: no change
    assert again.already_recorded and store.show(KEY).to_dict() == r.to_dict()


def test_explicit_lessons_and_failures(store):
    store.record_session(KEY, breakdown(1.3, verdict="revert"), "s1", lessons=["bf16 KV cache hurts here"],
                         failures=[{"changes": {"kv_dtype": "fp8"}, "rule": "reject-quality", "ratio": 1.4}])
    r = store.show(KEY)
    assert [les["text"] for les in r.lessons] == ["bf16 KV cache hurts here"]
    assert [(f["changes"], f["rule"], f["session_id"]) for f in r.failed] == [({"kv_dtype": "fp8"}, "reject-quality", "s1")]
    with pytest.raises(ValueError, match="rule"):
        store.record_session(KEY, breakdown(), "s2", failures=[{"changes": {}}])


# --------------------------------------------------------------------------- relaxed lookup
def _key(**kw):
    return replace(KEY, **kw)


def test_relaxation_order_and_confidences_are_documented():
    assert [(t.name, t.confidence) for t in TIERS] == [
        ("exact", 1.0), ("framework_version", 0.9), ("hardware", 0.7), ("model", 0.5),
        ("architecture", 0.35), ("model_type", 0.2)]
    assert TIERS[2].relaxed == ("framework_version", "hardware")
    assert all("precision" not in t.relaxed and "framework" not in t.relaxed for t in TIERS)
    assert sorted(KEY_FIELDS) == sorted(set(TIERS[-1].relaxed) | {"precision", "framework"})


@pytest.mark.parametrize("seeded, tier", [
    (dict(), 0),
    (dict(framework_version="4.0.0"), 1),
    (dict(framework_version="4.0.0", hardware="NVIDIA A100"), 2),
    (dict(hardware="NVIDIA A100", model="llama-3.1-70b"), 3),
    (dict(model="my-llama", architecture="LlamaModel"), 4),
    (dict(model="mistral-7b", model_type="mistral", architecture="MistralForCausalLM"), 5),
])
def test_each_tier_matches_with_its_confidence(store, seeded, tier):
    store.record_session(_key(**seeded), breakdown(1.4), "seed")
    res = store.lookup(KEY)
    assert res.chosen is not None and res.chosen_tier == tier and res.confidence == TIERS[tier].confidence
    assert [t.tier.index for t in res.tiers] == list(range(6))
    assert all(t.tried for t in res.tiers[: tier + 1]) and not any(t.tried for t in res.tiers[tier + 1:])
    assert all(t.matched is None for t in res.tiers[:tier]) and res.tiers[tier].matched.id == res.chosen.id
    assert "chosen: recipe #" in format_lookup(res)


def test_closest_tier_wins_and_best_ratio_within_a_tier(store):
    store.record_session(_key(hardware="NVIDIA A100"), breakdown(1.9), "far")
    store.record_session(_key(framework_version="4.0.0"), breakdown(1.2), "near")
    store.record_session(_key(framework_version="4.1.0"), breakdown(1.3), "near-better")
    res = store.lookup(KEY)
    assert res.chosen_tier == 1 and res.chosen.winner["session_id"] == "near-better"
    assert res.tiers[1].candidates == 2


def test_precision_and_framework_are_never_relaxed(store):
    store.record_session(_key(precision="float16"), breakdown(1.5), "fp16")
    store.record_session(_key(framework="synthetic"), breakdown(1.5), "synthetic")
    res = store.lookup(KEY)
    assert res.chosen is None and all(t.matched is None for t in res.tiers)
    assert "start from stock" in format_lookup(res)
    assert store.lookup(_key(precision="float16", model="other", hardware="x")).chosen.winner["session_id"] == "fp16"


def test_min_confidence_and_priors_from_failures(store):
    store.record_session(_key(hardware="NVIDIA A100"), breakdown(1.4), "a100")          # tier 2 (0.7)
    store.record_session(KEY, breakdown(1.4, verdict="inconclusive"), "exact-failed")    # exact row, no winner
    res = store.lookup(KEY, min_confidence=0.8)
    assert res.chosen is None and res.exact is not None and res.exact.winner is None
    assert "no winning configuration" in res.tiers[0].note
    assert not res.tiers[2].tried and "min_confidence" in res.tiers[2].note
    res = store.lookup(KEY, min_confidence=0.5)
    assert res.chosen_tier == 2 and res.confidence == 0.7
    by_src = {(p["rule"], p["confidence"]) for p in res.priors}
    assert ("final-inconclusive", 1.0) in by_src and ("revert", 1.0) in by_src and ("pinned_knob", 0.7) not in by_src
    assert all({"changes", "rule", "source_key"} <= set(p) for p in res.priors)
    json.dumps(res.to_dict())


# --------------------------------------------------------------------------- drift
def test_drift_halves_confidence_and_a_new_winner_replaces_it(store):
    store.record_session(KEY, breakdown(1.6), "s1")
    store.record_session(_key(framework_version="4.0.0"), breakdown(1.2), "old-version")
    assert store.mark_drift(KEY, "stale", expected_winner="someone-else").status == "ok"   # winner changed: no-op
    r = store.mark_drift(KEY, "replayed x1.01 against recorded x1.60", session_id="s2", expected_winner="s1")
    assert r.status == "drift" and r.drift_note.startswith("replayed") and r.sessions[-1]["kind"] == "drift"
    res = store.lookup(KEY)
    assert res.tiers[0].confidence == 1.0 * DRIFT_FACTOR
    assert res.chosen_tier == 1 and res.confidence == 0.9          # a closer non-drifted recipe wins
    assert store.record_session(KEY, breakdown(1.1, changes={"sdpa_backend": "math"}), "s3").winner_entered
    r = store.show(KEY)
    assert r.status == "ok" and r.drift_note is None and r.winner["session_id"] == "s3"
    assert store.lookup(KEY).chosen_tier == 0
    store.record_session(_key(model="no-winner"), breakdown(final=False), "s4")
    with pytest.raises(KBError, match="no winning configuration"):
        store.mark_drift(_key(model="no-winner"), "x")
    with pytest.raises(KBError, match="no recipe"):
        store.mark_drift(999, "x")


# --------------------------------------------------------------------------- export / import
def _seed(store):
    store.record_session(KEY, breakdown(1.5), "s1")
    store.record_session(KEY, breakdown(1.2, quality=False), "s2")
    store.record_session(_key(hardware="NVIDIA A100"), breakdown(1.3), "s3")
    store.mark_drift(_key(hardware="NVIDIA A100"), "did not reproduce")
    store.record_session(_key(model="nothing-kept"), breakdown(final=False), "s4")
    store.put_ceiling("NVIDIA H200", mem_bw_bytes_per_s=4.3e12, matmul_flops_per_s=7.0e14, measured_at=1000.0,
                      details={"method": "copy + gemm"})


def _comparable(s):
    return [{k: v for k, v in r.to_dict().items() if k not in ("id", "updated_at")} for r in s.list_recipes()]


def test_export_import_round_trip_and_idempotent(store, tmp_path):
    _seed(store)
    doc = store.export_document()
    write_json_atomic(tmp_path / "kb.json", doc)
    assert doc["schema_version"] == SCHEMA_VERSION and len(doc["recipes"]) == 3 and len(doc["ceilings"]) == 1
    with RecipeStore(str(tmp_path / "other.sqlite")) as other:
        first = other.import_json(tmp_path / "kb.json")
        assert (first.recipes_seen, first.recipes_changed, first.winners_entered, first.ceilings_changed) == (3, 3, 2, 1)
        assert _comparable(other) == _comparable(store)
        assert other.get_ceiling("NVIDIA H200").details == {"method": "copy + gemm"}
        again = other.import_json(tmp_path / "kb.json")
        assert (again.recipes_changed, again.winners_entered, again.ceilings_changed) == (0, 0, 0)
        assert _comparable(other) == _comparable(store)
    assert store.import_json(tmp_path / "kb.json").recipes_changed == 0   # into itself: nothing changes


def test_import_merges_under_the_strict_rules(store, tmp_path):
    store.record_session(KEY, breakdown(1.2), "local")
    with RecipeStore(str(tmp_path / "remote.sqlite")) as remote:
        remote.record_session(KEY, breakdown(1.6, changes={"sdpa_backend": "math"}), "remote")
        remote.record_session(_key(model="forged"), breakdown(1.9), "forged")
        remote.put_ceiling("NVIDIA H200", mem_bw_bytes_per_s=4.0e12, matmul_flops_per_s=6.0e14, measured_at=500.0)
        doc = remote.export_document()
        write_json_atomic(tmp_path / "remote.json", doc)
    for r in doc["recipes"]:   # tamper: a winner whose evidence fails the strict rules must not enter
        if r["key"]["model"] == "forged":
            r["winner"]["evidence"]["quality_passed"] = False
    (tmp_path / "remote.json").write_text(json.dumps(doc))
    store.put_ceiling("NVIDIA H200", mem_bw_bytes_per_s=4.3e12, matmul_flops_per_s=7.0e14, measured_at=1000.0)
    res = store.import_json(tmp_path / "remote.json")
    assert (res.winners_entered, res.winners_rejected, res.ceilings_changed) == (1, 1, 0)
    r = store.show(KEY)
    assert r.winner["session_id"] == "remote" and r.session_ids == ["local", "remote"]
    assert store.show(_key(model="forged")).winner is None
    assert store.get_ceiling("NVIDIA H200").measured_at == 1000.0   # the newer measurement stays


# --------------------------------------------------------------------------- concurrency
WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[3])
    from test_kb import KEY, breakdown
    from dataclasses import replace
    from inferloom.kb import RecipeStore
    store = RecipeStore(sys.argv[1])
    w, n = int(sys.argv[2]), int(sys.argv[4])
    for i in range(n):
        key = replace(KEY, model=f"m{i % 3}")
        ratio = 1.0 + (w * n + i) / 1000
        store.record_session(key, breakdown(ratio, quality=(i % 4 != 0)), f"w{w}-{i}")
        if i % 5 == 0:
            store.put_ceiling(f"dev{w}", mem_bw_bytes_per_s=1e12 + i, matmul_flops_per_s=1e14)
        store.lookup(key)
""")


def test_concurrent_writers_do_not_corrupt_or_lose_updates(tmp_path):
    path, n, procs = tmp_path / "kb.sqlite", 15, 4
    RecipeStore(str(path)).close()
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    here = str(Path(__file__).parent)
    ps = [subprocess.Popen([sys.executable, str(script), str(path), str(w), here, str(n)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(procs)]
    for p in ps:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()
    with RecipeStore(str(path)) as s:
        recs = s.list_recipes()
        assert len(recs) == 3
        assert sum(len(r.session_ids) for r in recs) == procs * n          # no lost update
        for r in recs:
            m = int(r.key.model[1:])
            valid = [1.0 + (w * n + i) / 1000 for w in range(procs) for i in range(n) if i % 3 == m and i % 4 != 0]
            assert r.winner["ratio"] == pytest.approx(max(valid))
            assert len({x["session_id"] for x in r.failed}) == len(r.session_ids)   # every session's failures
        assert len(s.list_ceilings()) == procs


# --------------------------------------------------------------------------- errors, defaults, keys
def test_bad_locations_give_one_line_errors(tmp_path):
    for url, what in [("://nope", "not a SQL URL"), ("nosuchdialect://x/y", "no driver")]:
        with pytest.raises(KBError, match=what) as ei:
            RecipeStore(url)
        assert "\n" not in str(ei.value)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database, just text" * 100)
    with pytest.raises(KBError) as ei:
        RecipeStore(str(junk))
    assert str(junk) in str(ei.value) and "not an inferloom KB" in str(ei.value) and "\n" not in str(ei.value)
    with pytest.raises(KBError, match="is a directory"):
        RecipeStore(str(tmp_path))
    newer = tmp_path / "newer.sqlite"
    RecipeStore(str(newer)).close()
    con = sqlite3.connect(newer)
    con.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    con.commit()
    con.close()
    with pytest.raises(KBError, match="newer inferloom"):
        RecipeStore(str(newer))


def test_bad_export_files(store, tmp_path):
    with pytest.raises(KBError, match="not found"):
        store.import_json(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(KBError, match=r"bad\.json: not valid JSON"):
        store.import_json(bad)
    bad.write_text(json.dumps({"format": "inferloom-kb", "schema_version": 1, "recipes": [{"key": {"model": "x"}}]}))
    with pytest.raises(KBError, match="missing field"):
        store.import_json(bad)


def test_default_url(monkeypatch, tmp_path):
    monkeypatch.delenv("INFERLOOM_KB", raising=False)
    assert default_kb_url().endswith("/.cache/inferloom/kb.sqlite") and default_kb_url().startswith("sqlite:///")
    monkeypatch.setenv("INFERLOOM_KB", str(tmp_path / "k.sqlite"))
    assert default_kb_url() == f"sqlite:///{tmp_path / 'k.sqlite'}"
    monkeypatch.setenv("INFERLOOM_KB", "postgresql://kb@db/inferloom")
    assert default_kb_url() == "postgresql://kb@db/inferloom"


def test_workload_key_from_session_and_spec():
    manifest = {"spec": {"model": "/models/Llama-3.1-8B-Instruct/", "framework": "transformers", "dtype": "bfloat16"},
                "device": {"name": "NVIDIA H200"},
                "adapter": {"framework": "transformers", "transformers_version": "5.24.0", "device_name": "NVIDIA H200",
                            "model_info": {"architecture": "LlamaForCausalLM", "model_type": "llama"}}}
    k = WorkloadKey.from_session(manifest)
    assert k == _key(model="Llama-3.1-8B-Instruct")
    fake = {"spec": {"model": "llama-tiny", "framework": "synthetic", "dtype": "float32"}, "device": {"name": "Xeon"},
            "adapter": {"framework": "synthetic", "versions": {"inferloom": "0.1.0"}}}
    assert WorkloadKey.from_session(fake) == WorkloadKey("llama-tiny", "Xeon", "synthetic", "unknown", "unknown",
                                                         "0.1.0", "float32")

    class Spec:
        model, framework, dtype = "/models/Llama-3.1-8B-Instruct", "transformers", "bfloat16"

    assert WorkloadKey.from_spec(Spec(), hardware="NVIDIA H200", framework_version="5.24.0",
                                 model_info={"architecture": "LlamaForCausalLM", "model_type": "llama"}) == k
    assert WorkloadKey.from_dict(k.to_dict()) == k
    with pytest.raises(ValueError, match="precision"):
        _key(precision="")



def test_record_a_real_synthetic_session_directory(store, tmp_path):
    """End to end: a closed session (synthetic adapter, +20% knob) enters its winner."""
    from inferloom.agents.rules import RuleCritic, RuleOrchestrator, RuleRobustness
    from inferloom.phases.runner import start
    from inferloom.spec import load_spec
    from inferloom.workloads.base import Knob
    from inferloom.workloads.synthetic import SyntheticAdapter

    spec = load_spec(None, {"model": "llama-tiny", "framework": "synthetic", "device": "cpu",
                            "protocol.bootstrap_resamples": 999, "quality.eval_prompts": 4,
                            "quality.heldout_prompts": 4, "quality.prompt_len": 8, "quality.continuation_len": 8})
    adapter = SyntheticAdapter(effects={"fast_path": {True: 1.20}}, numerics={}, noise_sd=0.05,
                               knobs=[Knob("fast_path", "bool", False, "synthetic +20%")])
    start(tmp_path / "s", spec, budget_minutes=10, max_trials=3, adapter=adapter, kb_url=None,
          agents={"orchestrator": RuleOrchestrator(seed=0), "critic_factory": RuleCritic,
                  "robustness": RuleRobustness()})
    d = tmp_path / "s"
    key, res = store.record_closed_session(manifest=read_manifest(d), state=load_state(d),
                                           breakdown=breakdown_from_ledger(read_entries(d)))
    assert (key.model, key.framework, key.precision) == ("llama-tiny", "synthetic", "float32")
    assert res.winner_entered, res.reason
    assert store.lookup(key).chosen.winner["changes"] == {"fast_path": True}


def test_a_closed_session_files_its_recipe_in_the_default_kb(tmp_path):
    """CLOSE writes the recipe itself (to $INFERLOOM_KB, isolated per test by conftest)."""
    from inferloom.agents.rules import RuleCritic, RuleOrchestrator, RuleRobustness
    from inferloom.kb import RecipeStore
    from inferloom.phases.runner import start
    from inferloom.spec import load_spec
    from inferloom.workloads.base import Knob
    from inferloom.workloads.synthetic import SyntheticAdapter

    spec = load_spec(None, {"model": "llama-tiny", "framework": "synthetic", "device": "cpu",
                            "protocol.bootstrap_resamples": 999, "quality.eval_prompts": 4,
                            "quality.heldout_prompts": 4, "quality.prompt_len": 8, "quality.continuation_len": 8})
    adapter = SyntheticAdapter(effects={"fast_path": {True: 1.20}}, numerics={}, noise_sd=0.05,
                               knobs=[Knob("fast_path", "bool", False, "synthetic +20%")])
    start(tmp_path / "s", spec, budget_minutes=10, max_trials=3, adapter=adapter,
          agents={"orchestrator": RuleOrchestrator(seed=0), "critic_factory": RuleCritic,
                  "robustness": RuleRobustness()})
    with RecipeStore() as store:
        recipes = store.list_recipes()
    assert len(recipes) == 1 and recipes[0].winner["changes"] == {"fast_path": True}


def test_kb_cli_lookup_list_export_import(tmp_path):
    import json
    import os
    import subprocess
    import sys

    def cli(*a):
        return subprocess.run([sys.executable, "-m", "inferloom.cli", "kb", "--kb", str(tmp_path / "k.sqlite"), *a],
                              capture_output=True, text=True, env={**os.environ}, timeout=120)

    p = cli("lookup", "--model", "llama-tiny", "--device", "cpu")
    assert p.returncode == 0, p.stderr
    assert "tier 0 exact" in p.stdout and "precision=float32" in p.stdout and "chosen: none" in p.stdout
    assert cli("list").stdout.strip() == "the knowledge base holds no recipe yet"
    assert cli("export", str(tmp_path / "e.json")).returncode == 0
    doc = json.loads((tmp_path / "e.json").read_text())
    assert doc["schema_version"] and doc["recipes"] == []
    assert cli("import", str(tmp_path / "e.json")).returncode == 0
    bad = cli("import", str(tmp_path / "missing.json"))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
