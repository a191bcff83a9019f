"""Custom scriptable workloads (framework: custom): the adapter, its fail-closed
quality gate, and the spec section. The patch pipeline's session tests are in
test_patch_session.py."""

import pytest

from custom_helpers import tiny_custom_spec
from inferloom.spec import SpecError, load_spec
from inferloom.workloads.base import AdapterError, resolve_config
from inferloom.workloads.custom import GATE_FAILED, GATE_MISSING, GATE_UNPARSEABLE, TREE_KEY, CustomAdapter


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    a = CustomAdapter(tiny_custom_spec(tmp_path_factory.mktemp("tiny")))
    yield a
    a.close()


def _run(adapter, **changes):
    h = adapter.prepare(resolve_config(adapter.knob_space(), changes))
    try:
        return adapter.run(h, 5)
    finally:
        adapter.release(h)


def test_objective_and_knobs_reach_the_entrypoint(adapter):
    rec = _run(adapter, speed="200")
    assert rec.success, rec.error
    assert rec.extra["objective"] == {"value": 200.0, "unit": "items/s"}
    assert adapter.objective_metric(rec) == 200.0
    assert rec.extra["gate_rule"] is None and rec.extra["quality_gate"]["checks"] == {"max_err": 0.0}


def test_runs_never_happen_in_the_users_checkout(adapter):
    h = adapter.prepare(resolve_config(adapter.knob_space(), {}))
    try:
        assert adapter.repo not in h.tree.parents and h.tree != adapter.repo
    finally:
        adapter.release(h)


@pytest.mark.parametrize("mode, kind, text", [
    ("exit", "exit", "exit code 3"),
    ("sleep", "timeout", "timed out after 3 s"),
    ("noresult", "no_result", "wrote no result"),
    ("badjson", "bad_result", "not valid JSON"),
    ("badobj", "bad_result", "no positive finite objective"),
])
def test_failures_are_failed_runs_never_numbers(adapter, mode, kind, text):
    rec = _run(adapter, mode=mode)
    assert not rec.success and rec.extra["kind"] == kind and text in rec.error
    with pytest.raises(ValueError):
        adapter.objective_metric(rec)
    if mode == "exit":
        assert "boom: something broke" in rec.extra["stderr_tail"] and "boom" in rec.error


@pytest.mark.parametrize("gate, rule", [("fail", GATE_FAILED), ("none", GATE_MISSING), ("bad", GATE_UNPARSEABLE)])
def test_quality_gate_is_fail_closed(adapter, gate, rule):
    rec = _run(adapter, gate=gate)
    assert rec.success  # the measurement itself worked
    q = adapter.gate_quality([rec, _run(adapter)])
    assert q["passed"] is False and q["rule"] == rule and rule in q["failed"][0]


def test_lower_is_better_inverts_the_metric(tmp_path):
    a = CustomAdapter(tiny_custom_spec(tmp_path, higher_is_better=False))
    try:
        assert a.objective_metric(_run(a, speed="200")) == pytest.approx(1 / 200)
    finally:
        a.close()


def test_explicit_tree_and_missing_tree(adapter, tmp_path):
    with pytest.raises(AdapterError, match="does not exist"):
        adapter.prepare({**resolve_config(adapter.knob_space(), {}), TREE_KEY: str(tmp_path / "nope")})


def test_pinned_knob_cannot_be_overridden(tmp_path):
    spec = tiny_custom_spec(tmp_path)
    spec = spec.model_copy(update={"pinned": {"speed": "100"}})
    a = CustomAdapter(spec)
    try:
        from inferloom.workloads.base import ConfigError

        with pytest.raises(ConfigError, match="pinned"):
            a.prepare({"speed": "200"})
    finally:
        a.close()


def test_spec_custom_section_errors(tmp_path):
    with pytest.raises(SpecError, match="needs a 'custom' section"):
        load_spec(None, {"framework": "custom"})
    (tmp_path / "plain").mkdir()
    bad = tmp_path / "s.yaml"
    bad.write_text(f"framework: custom\ncustom:\n  repo: {tmp_path / 'plain'}\n  entrypoint: [python, run.py]\n")
    with pytest.raises(SpecError, match="custom.repo.*not a git checkout"):
        load_spec(bad)
    spec = tiny_custom_spec(tmp_path / "t").to_dict()
    spec["custom"]["patches"]["dir"] = str(tmp_path / "no-such-dir")
    import yaml

    bad.write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError, match="custom.patches.dir.*not a directory"):
        load_spec(bad)
    bad.write_text("framework: synthetic\ncustom:\n  repo: x\n  entrypoint: [a]\n")
    with pytest.raises(SpecError):
        load_spec(bad)


def test_bench_cli_on_a_custom_workload(tmp_path):
    import json

    import yaml

    from inferloom.cli import main

    spec = tiny_custom_spec(tmp_path)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec.to_dict()))
    common = ["--min-pairs", "3", "--max-pairs", "3", "--quiet"]
    assert main(["bench", str(path), "--candidate", "speed=200", "--out", str(tmp_path / "a.json"), *common]) == 0
    res = json.loads((tmp_path / "a.json").read_text())
    assert res["verdict"] == "keep" and res["quality"]["kind"] == "quality_gate" and res["quality"]["passed"]
    assert main(["bench", str(path), "--candidate", "speed=200", "--candidate", "gate=none",
                 "--out", str(tmp_path / "b.json"), *common]) == 0
    res = json.loads((tmp_path / "b.json").read_text())
    assert res["verdict"] == "reject-quality" and res["quality"]["rule"] == "quality_gate_missing"
