"""`run_bench` end to end on the deterministic synthetic adapter (fast)."""

import json

import pytest

from inferloom.bench import overall_verdict, run_bench
from inferloom.spec import load_spec
from inferloom.workloads.base import ConfigError
from inferloom.workloads.synthetic import SyntheticAdapter

SPEC = load_spec(None, {"model": "llama-tiny", "device": "cpu", "protocol.bootstrap_resamples": 999,
                        "quality.eval_prompts": 4, "quality.heldout_prompts": 4,
                        "quality.prompt_len": 8, "quality.continuation_len": 8})


def bench(candidate, aa=False, **kw):
    return run_bench(SPEC, candidate, aa=aa, adapter=SyntheticAdapter(noise_sd=0.05, **kw))


def test_true_gain_is_kept_and_result_is_json():
    res = bench({"fast_path": "true"})
    assert res["protocol"]["verdict"] == "keep"
    assert res["quality"]["passed"] is True
    assert res["verdict"] == "keep"
    d = res["protocol"]["decision"]
    assert d["ci_low"] > 1.01 and d["ci_low"] < 1.15 < d["ci_high"]
    json.dumps(res)  # fully serialisable, raw records included
    assert all("a" in p and "b" in p for p in res["protocol"]["pairs"])
    assert res["schema_version"] == 1 and res["spec_hash"]


def test_no_gain_is_not_kept():
    res = bench({"useless": "true"})
    assert res["verdict"] in ("revert", "inconclusive")


def test_fast_but_wrong_is_rejected_by_quality():
    res = bench({"approx_math": "true"})
    assert res["protocol"]["verdict"] == "keep"  # it is faster...
    assert res["quality"]["passed"] is False  # ...but it changed the outputs
    assert res["verdict"] == "reject-quality"
    assert any("top1_agreement" in m or "greedy_agreement" in m for m in res["quality"]["failed"])
    assert res["numerics_changing_knobs"] == ["approx_math"]


def test_aa_runs_every_planned_pair_and_reports_noise():
    res = bench({}, aa=True)
    assert res["kind"] == "aa"
    assert len(res["protocol"]["pairs"]) == SPEC.protocol.max_pairs
    assert res["noise"]["n_pairs"] == SPEC.protocol.max_pairs
    assert res["verdict"] == "noise-measured"
    assert res["quality"]["passed"] is True


def test_bad_candidates_are_input_errors():
    with pytest.raises(ConfigError, match="equals the stock"):
        bench({"fast_path": "false"})
    with pytest.raises(ConfigError, match="unknown knob"):
        bench({"warp_drive": "on"})
    with pytest.raises(ConfigError, match="no --candidate"):
        bench({"fast_path": "true"}, aa=True)


def test_failed_run_is_reported_not_hidden():
    res = bench({"fast_path": "true"}, fail_runs={"fast_path": {True: "synthetic crash"}})
    assert res["verdict"] == "failed" and "synthetic crash" in res["error"]
    assert "protocol" not in res  # it failed in warm-up: no numbers were produced


def test_overall_verdict_table():
    assert overall_verdict("keep", True, False) == "keep"
    assert overall_verdict("keep", False, False) == "reject-quality"
    assert overall_verdict("keep", None, False) == "keep-unscored"
    assert overall_verdict("revert", True, False) == "revert"
    assert overall_verdict("failed", None, False) == "failed"


class _Interrupted(SyntheticAdapter):
    """Ctrl-C during the 7th run: after both warm-ups and two complete pairs."""

    runs = 0

    def run(self, handle, seed):
        type(self).runs += 1
        if self.runs == 7:
            raise KeyboardInterrupt
        return super().run(handle, seed)


def test_an_interrupted_bench_keeps_the_pairs_it_measured(tmp_path, monkeypatch, capsys):
    import inferloom.bench as B
    from inferloom.cli import main

    monkeypatch.setattr(B, "make_adapter", lambda spec: _Interrupted(noise_sd=0.05))
    out = tmp_path / "b.json"
    rc = main(["bench", "--model", "llama-tiny", "--device", "cpu", "--candidate", "fast_path=true", "--quiet",
               "--no-quality", "--out", str(out)])
    assert rc == 130 and not out.exists()
    lines = [json.loads(x) for x in (tmp_path / "b.json.pairs.jsonl").read_text().splitlines()]
    assert [x["pair"]["index"] for x in lines] == [0, 1] and all(x["pair"]["value_b"] > 0 for x in lines)
    assert "the 2 pair(s) measured are in" in capsys.readouterr().err
    monkeypatch.setattr(B, "make_adapter", lambda spec: SyntheticAdapter(noise_sd=0.05))
    kept = (tmp_path / "b.json.pairs.jsonl").read_bytes()  # a rerun without --force never deletes them
    assert main(["bench", "--model", "llama-tiny", "--device", "cpu", "--candidate", "fast_path=true", "--quiet",
                 "--no-quality", "--out", str(out)]) == 2
    assert "holds the pairs of an interrupted bench" in capsys.readouterr().err
    assert (tmp_path / "b.json.pairs.jsonl").read_bytes() == kept and not out.exists()
    assert main(["bench", "--model", "llama-tiny", "--device", "cpu", "--candidate", "fast_path=true", "--quiet",
                 "--no-quality", "--out", str(out), "--force"]) == 0
    assert out.exists() and not (tmp_path / "b.json.pairs.jsonl").exists()  # the whole result replaces them


def test_a_bench_without_out_writes_its_pairs_beside_the_default_result(tmp_path, monkeypatch):
    """No --out and no runs/ yet: the pairs file's folder is made like the result's (before, the first
    pair's write raised FileNotFoundError there)."""
    import inferloom.bench as B
    from inferloom.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(B, "make_adapter", lambda spec: SyntheticAdapter(noise_sd=0.05))
    assert main(["bench", "--model", "llama-tiny", "--device", "cpu", "--candidate", "fast_path=true", "--quiet",
                 "--no-quality"]) == 0
    assert [p.suffix for p in (tmp_path / "runs").iterdir()] == [".json"]  # the result; its pairs file removed
