"""The published engine choice (docs/results/sglang-h200-2026-12-05/engines: `inferloom engines` on one H200,
2026-12-05, SGLang 0.5.17 against vLLM 0.26.0 on the Llama-3.1-8B shape) re-derives from its raw pairs: the
log-ratios from each pair's two values, the protocol's decision from them under the settings the run recorded,
the engine decision and the headline from that. Nothing here is re-measured; a number the files state that their
own raw records do not give fails the test."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from inferloom.engine_choice.decide import engine_decision
from inferloom.measure.protocol import ProtocolSettings, decision_at

ENGINES = Path(__file__).resolve().parents[1] / "docs" / "results" / "sglang-h200-2026-12-05" / "engines"


def _records():
    recs = [json.loads(line) for line in (ENGINES / "engines_pairs.jsonl").read_text().splitlines() if line.strip()]
    return recs[0], [r for r in recs if r["kind"] == "pair"], next(r for r in recs if r["kind"] == "result")


def test_the_published_engine_decision_re_derives_from_its_pairs():
    setup, pairs, result = _records()
    assert [p["index"] for p in pairs] == list(range(len(pairs))) and [p["order"] for p in pairs] == ["AB", "BA"] * 2 + ["AB"]
    logs = [math.log(p["value_b"] / p["value_a"]) for p in pairs]
    assert logs == pytest.approx([p["log_ratio"] for p in pairs], abs=1e-12)
    fields = {f.name for f in dataclasses.fields(ProtocolSettings)}
    settings = ProtocolSettings(**{k: v for k, v in setup["settings"].items() if k in fields})
    dec = decision_at(logs, settings)
    published = result["protocol"]["decision"]
    assert (dec.verdict, dec.n_pairs) == (published["verdict"], published["n_pairs"]) == ("revert", 5)
    assert (dec.ratio, dec.ci_low, dec.ci_high) == pytest.approx(
        (published["ratio"], published["ci_low"], published["ci_high"]), rel=1e-9)
    # the engine decision and the headline engines.md and engines.json state come from that decision
    measurement = {**result, "protocol": {**result["protocol"], "decision": published}}
    mine = engine_decision(measurement)
    doc = json.loads((ENGINES / "engines.json").read_text())
    assert mine["outcome"] == doc["decision"]["outcome"] == "no_difference"
    assert (mine["ratio"], mine["ci_low"], mine["ci_high"]) == pytest.approx(
        (doc["decision"]["ratio"], doc["decision"]["ci_low"], doc["decision"]["ci_high"]), rel=1e-12)
    assert "x1.026 [x0.972, x1.082] over 5 pairs" in (ENGINES / "engines.md").read_text()
    # the medians engines.md states are the pairs' own
    a = sorted(p["value_a"] for p in pairs)[2]
    b = sorted(p["value_b"] for p in pairs)[2]
    assert f"medians: A {a:,.1f}, B {b:,.1f} output tok/s" in (ENGINES / "engines.md").read_text()
