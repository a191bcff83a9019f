"""The measurement protocol: decisions on synthetic sources with known truth."""

from __future__ import annotations

import json
import math
from dataclasses import fields, replace

import numpy as np
import pytest

from inferloom.measure.protocol import (
    ProtocolSettings,
    decide,
    noise_floor,
    planned_looks,
    run_paired,
)
from inferloom.spec import ProtocolSpec
from inferloom.workloads.base import RunRecord

FAST = ProtocolSettings(bootstrap_resamples=999)
ZERO_GAIN = replace(FAST, min_gain=0.0)
# the bonferroni design as it was the default before the sequential one (results written then read with it)
BONF = ProtocolSettings(design="bonferroni", confidence=0.95, min_pairs=5, max_pairs=15, pair_step=2,
                        bootstrap_resamples=999)
BONF_ZERO_GAIN = replace(BONF, min_gain=0.0)
NOISE = 0.05  # lognormal sd per run


def source(ratio: float, rng: np.random.Generator, noise: float = NOISE, calls: list | None = None):
    """Two run functions whose true throughputs differ by ``ratio`` (B over A)."""

    def make(arm: str, mult: float):
        def run(seed: int) -> RunRecord:
            if calls is not None:
                calls.append((arm, seed))
            tps = 1000.0 * mult * math.exp(noise * rng.standard_normal())
            return RunRecord(config_id=arm, seed=seed, success=True, wall_s=100.0 / tps,
                             output_tokens=100, expected_output_tokens=100, num_requests=1)
        return run

    return make("A", 1.0), make("B", ratio)


def protocol(ratio: float, seed: int, settings: ProtocolSettings = FAST, **kw):
    a, b = source(ratio, np.random.default_rng(seed))
    return run_paired(a, b, settings, seed_base=100, **kw)


def test_settings_from_spec_and_validation():
    s = ProtocolSettings.from_spec(ProtocolSpec())
    assert (s.design, s.min_gain, s.confidence, s.min_pairs, s.max_pairs, s.pair_step) == \
        ("sequential", 0.01, 0.98, 6, 30, 4)
    assert (s.target_gain, s.power, s.futility_error, s.trim, s.spending_power) == (0.03, 0.9, 0.05, 0.05, 4.0)
    assert (s.warmup_runs, s.bootstrap_resamples, s.bootstrap_seed) == (1, 4999, 12345)
    assert planned_looks(s) == [6, 10, 14, 18, 22, 26, 30]
    assert planned_looks(BONF) == [5, 7, 9, 11, 13, 15]
    assert planned_looks(ProtocolSettings(min_pairs=5, max_pairs=10, pair_step=3)) == [5, 8, 10]
    with pytest.raises(ValueError, match="max_pairs"):
        ProtocolSettings.from_spec(ProtocolSpec(min_pairs=8, max_pairs=6))
    with pytest.raises(ValueError, match="max_pairs"):
        ProtocolSettings(min_pairs=8, max_pairs=6)


def test_settings_take_every_default_and_bound_from_the_spec():
    """One source per setting: ProtocolSpec declares each default and bound;
    ProtocolSettings adds only t_guard and the session's A/A (prior_sd, prior_df, floor)."""
    spec_fields = ProtocolSpec.model_fields
    assert {f.name for f in fields(ProtocolSettings)} == set(spec_fields) | {"t_guard", "prior_sd", "prior_df", "floor"}
    for f in fields(ProtocolSettings):
        if f.name in spec_fields:
            assert f.default == spec_fields[f.name].default, f.name
    assert ProtocolSettings() == ProtocolSettings.from_spec(ProtocolSpec())
    # the spec's bounds, not looser ones (min_pairs >= 3, warmup_runs >= 1, bootstrap_resamples >= 199)
    for bad in ({"min_pairs": 2}, {"warmup_runs": 0}, {"bootstrap_resamples": 99}, {"min_gain": 1.0},
                {"confidence": 0.5}):
        (key,) = bad
        with pytest.raises(ValueError, match=f"protocol {key}"):
            ProtocolSettings(**bad)
        with pytest.raises(ValueError):
            ProtocolSpec(**bad)


def test_true_gain_is_kept():
    res = protocol(1.10, seed=1)
    assert res.verdict == "keep"
    assert res.decision is not None and res.decision.ci_low > 1.01
    assert 1.0 < res.decision.ratio < 1.25


def test_true_zero_is_not_kept():
    res = protocol(1.0, seed=2)
    assert res.verdict in ("inconclusive", "revert")


def test_true_loss_is_reverted():
    res = protocol(0.90, seed=3)
    assert res.verdict == "revert"
    # sequential: a futility stop (a gain worth keeping is out of reach) comes before the whole interval is
    # below the minimum gain; the decision says which
    d = res.decision
    assert d.stop == "futility" and d.futility_high < d.futility_gain and "out of reach" in d.reason
    old = protocol(0.90, seed=3, settings=BONF)
    assert old.verdict == "revert" and old.decision.ci_high < 1.01


def _rates(ratio: float, trials: int, settings: ProtocolSettings = FAST) -> dict[str, float]:
    counts: dict[str, int] = {}
    for k in range(trials):
        v = protocol(ratio, seed=10_000 + k, settings=settings).verdict
        counts[v] = counts.get(v, 0) + 1
    return {v: c / trials for v, c in counts.items()}


def test_false_keep_rate_true_zero():
    rates = _rates(1.0, 200)
    assert rates.get("keep", 0.0) <= 0.05, rates


def test_false_keep_rate_at_the_threshold():
    # true gain == min_gain: keeping is an error; nominal rate <= (1 - confidence) / 2
    rates = _rates(1.01, 200)
    assert rates.get("keep", 0.0) <= 0.05, rates


def test_power_true_ten_percent():
    rates = _rates(1.10, 200)
    assert rates.get("keep", 0.0) >= 0.85, rates


def test_decide_constant_data():
    FAST, ZERO_GAIN = BONF, BONF_ZERO_GAIN  # decide() is the bonferroni design's look
    d = decide([math.log(1.05)] * 6, FAST, final=False, n_looks=6)
    assert d.verdict == "keep" and d.method.startswith("percentile")
    assert d.ci_low == pytest.approx(1.05) and d.ci_high == pytest.approx(1.05)
    assert d.sd_log == 0.0
    assert decide([0.0] * 6, FAST, final=True, n_looks=6).verdict == "revert"
    assert decide([0.0] * 6, ZERO_GAIN, final=True, n_looks=6).verdict == "inconclusive"
    assert decide([0.0] * 6, ZERO_GAIN, final=False, n_looks=6).verdict == "continue"


def test_decide_fields_and_bonferroni():
    FAST = BONF
    rng = np.random.default_rng(0)
    lr = list(np.log(1.03) + 0.02 * rng.standard_normal(9))
    d = decide(lr, FAST, final=False, n_looks=6)
    assert d.confidence_per_look == pytest.approx(1 - 0.05 / 6)
    assert d.ratio == pytest.approx(math.exp(np.mean(lr)))
    assert d.ci_low <= d.ratio <= d.ci_high
    assert d.ci_low <= min(d.boot_ci_low, d.t_ci_low) + 1e-12
    assert d.gain_pct == pytest.approx((d.ratio - 1) * 100)
    assert d.method in ("BCa+t", "percentile+t")
    assert d.resamples == 999 and d.bootstrap_seed == 12345 and d.min_gain == 0.01
    json.dumps(d.to_dict())
    one = decide(lr, FAST, final=False, n_looks=1)
    assert one.ci_high - one.ci_low < d.ci_high - d.ci_low  # more looks, wider interval
    pure = decide(lr, ProtocolSettings(bootstrap_resamples=999, t_guard=False), final=False, n_looks=6)
    assert pure.method == "BCa" and pure.t_ci_low is None


def test_decide_rejects_bad_input():
    with pytest.raises(ValueError):
        decide([0.1], FAST, final=True, n_looks=1)
    with pytest.raises(ValueError):
        decide([0.1, float("nan")], FAST, final=True, n_looks=1)


def test_bootstrap_seed_makes_decide_reproducible():
    rng = np.random.default_rng(7)
    lr = list(0.02 + 0.05 * rng.standard_normal(7))
    s = ProtocolSettings(bootstrap_resamples=999, t_guard=False)
    d1 = decide(lr, s, final=False, n_looks=6)
    d2 = decide(lr, s, final=False, n_looks=6)
    assert d1 == d2
    other = decide(lr, ProtocolSettings(bootstrap_resamples=999, t_guard=False, bootstrap_seed=1),
                   final=False, n_looks=6)
    assert (other.ci_low, other.ci_high) != (d1.ci_low, d1.ci_high)


def test_abba_order_and_seeds():
    calls: list = []
    a, b = source(1.0, np.random.default_rng(5), calls=calls)
    seen = []
    res = run_paired(a, b, FAST, seed_base=40, on_pair=lambda p, d: seen.append((p.index, d)))
    n = len(res.pairs)
    assert [p.order for p in res.pairs] == ["AB" if i % 2 == 0 else "BA" for i in range(n)]
    expected = []
    for i in range(n):
        expected += [("A", 40 + i), ("B", 40 + i)] if i % 2 == 0 else [("B", 40 + i), ("A", 40 + i)]
    assert calls == expected
    seeds = [p.seed for p in res.pairs]
    assert all(p.a.seed == p.b.seed == p.seed for p in res.pairs)
    assert len(set(seeds)) == n
    looks = planned_looks(FAST)
    assert [i + 1 for i, d in seen if d is not None] == [k for k in looks if k <= n]
    assert len(res.looks) == len([k for k in looks if k <= n])


def test_stops_at_first_decisive_look():
    # the sequential design spends little error at the first look (O'Brien-Fleming-like), so +50% at 5%
    # noise is kept at the second look; the bonferroni design kept it at the first
    res = protocol(1.5, seed=9)
    assert res.verdict == "keep" and len(res.pairs) == planned_looks(FAST)[1]
    assert [lk.verdict for lk in res.looks] == ["continue", "keep"] and res.decision.stop == "efficacy"
    old = protocol(1.5, seed=9, settings=BONF)
    assert old.verdict == "keep" and len(old.pairs) == BONF.min_pairs


def test_failed_run_stops_with_error():
    rng = np.random.default_rng(3)
    a, _ = source(1.0, rng)

    def b(seed: int) -> RunRecord:
        if seed == 102:
            return RunRecord(config_id="B", seed=seed, success=False, error="CUDA out of memory")
        return a(seed)

    res = run_paired(a, b, FAST, seed_base=100)
    assert res.verdict == "failed"
    assert "CUDA out of memory" in res.error and "pair 2" in res.error
    assert len(res.pairs) == 2 and res.decision is None
    assert [arm for arm, _ in res.incomplete] == ["A", "B"]
    assert res.incomplete[1][1].success is False
    out = json.loads(json.dumps(res.to_dict()))
    assert out["verdict"] == "failed" and out["incomplete"][1]["record"]["error"] == "CUDA out of memory"


def test_invalid_record_is_a_failure():
    a, _ = source(1.0, np.random.default_rng(3))
    bad = lambda seed: RunRecord(config_id="B", seed=seed, success=True, wall_s=0.0)  # noqa: E731
    res = run_paired(a, bad, FAST, seed_base=0)
    assert res.verdict == "failed" and "invalid record" in res.error


def test_result_json_roundtrip_keeps_raw_records():
    res = protocol(1.1, seed=4)
    d = json.loads(json.dumps(res.to_dict()))
    assert d["verdict"] == res.verdict
    assert len(d["pairs"]) == len(res.pairs)
    assert RunRecord.from_dict(d["pairs"][0]["a"]) == res.pairs[0].a
    assert d["settings"]["bootstrap_resamples"] == 999


def test_noise_floor_aa():
    res = protocol(1.0, seed=11, settings=ZERO_GAIN, stop_early=False)
    assert len(res.pairs) == FAST.max_pairs
    assert [lk.n_pairs for lk in res.looks] == planned_looks(FAST)  # every look, budget max_pairs
    assert all(lk.budget == FAST.max_pairs for lk in res.looks)
    nf = noise_floor(res)
    assert nf["n_pairs"] == 30
    assert nf["sd_run_est"] == pytest.approx(NOISE, rel=0.5)
    assert 0.5 < nf["ci_half_width_pct"] < 15
    assert nf["ratio"] == pytest.approx(1.0, abs=0.05)
