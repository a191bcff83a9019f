"""The synthetic adapter: deterministic, honest about its true effects."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from inferloom.measure.metrics import output_tokens_per_s
from inferloom.measure.protocol import ProtocolSettings, run_paired
from inferloom.workloads.base import AdapterError, WorkloadAdapter
from inferloom.workloads.synthetic import SyntheticAdapter

FAST = ProtocolSettings(bootstrap_resamples=999)


def test_implements_protocol_and_describe():
    ad = SyntheticAdapter()
    assert isinstance(ad, WorkloadAdapter)
    json.dumps(ad.describe())
    names = {k.name for k in ad.knob_space()}
    assert {"fast_path", "useless", "precision"} <= names
    assert next(k for k in ad.knob_space() if k.name == "precision").changes_numerics


def test_run_is_deterministic_and_has_the_true_effect():
    ad1, ad2 = SyntheticAdapter(seed=3), SyntheticAdapter(seed=3)
    h1, h2 = ad1.prepare({}), ad2.prepare({})
    r1, r2 = ad1.run(h1, 42), ad2.run(h2, 42)
    assert r1.wall_s == r2.wall_s and r1.success
    assert r1.output_tokens == r1.expected_output_tokens == 8 * 16
    assert sum(b["size"] for b in r1.batches) == r1.num_requests
    ad = SyntheticAdapter(effects={"fast_path": {True: 1.2}}, noise_sd=0.0)
    stock, fast = ad.prepare({}), ad.prepare({"fast_path": True})
    ratio = output_tokens_per_s(ad.run(fast, 1)) / output_tokens_per_s(ad.run(stock, 1))
    assert ratio == pytest.approx(1.2)
    assert ad.true_multiplier({"fast_path": True}) == pytest.approx(1.2)
    assert ad.run(stock, 1).started_at > 0.0  # virtual clock advances


def test_noise_depends_on_handle_and_seed():
    ad = SyntheticAdapter(noise_sd=0.05, seed=1)
    h1, h2 = ad.prepare({}), ad.prepare({})
    walls = [ad.run(h, s).wall_s for h in (h1, h2) for s in range(50)]
    assert len(set(walls)) == 100
    log_tps = np.log((8 * 16) / np.array(walls) / ad.base_tps)
    assert np.std(log_tps) == pytest.approx(0.05, rel=0.3)
    assert abs(np.mean(log_tps)) < 0.02


def test_abba_cancels_linear_drift():
    ad = SyntheticAdapter(noise_sd=0.0, drift_per_run=0.01)
    a, b = ad.prepare({}), ad.prepare({"useless": True})
    res = run_paired(lambda s: ad.run(a, s), lambda s: ad.run(b, s),
                     ProtocolSettings(bootstrap_resamples=999, min_pairs=6, max_pairs=6, min_gain=0.0),
                     seed_base=0)
    assert [p.log_ratio for p in res.pairs] == pytest.approx([0.01, -0.01] * 3)
    assert res.decision.mean_log == pytest.approx(0.0, abs=1e-12)
    # sequential design: a zero effect measured this tightly puts the +3% target out of reach (futility);
    # the bonferroni design called the same pairs inconclusive
    assert res.verdict == "revert" and res.decision.stop == "futility"


def test_config_validation_and_failures():
    ad = SyntheticAdapter(fail_runs={"useless": {True: "simulated OOM"}},
                          fail_prepare={"fast_path": {True: "not supported here"}})
    with pytest.raises(ValueError, match="unknown knob"):
        ad.prepare({"nope": 1})
    with pytest.raises(AdapterError, match="not supported"):
        ad.prepare({"fast_path": True})
    rec = ad.run(ad.prepare({"useless": True}), 0)
    assert not rec.success and "simulated OOM" in rec.error and rec.extra["kind"] == "synthetic"
    with pytest.raises(ValueError, match="unknown knob"):
        SyntheticAdapter(effects={"nope": {True: 2.0}})


def test_release_and_close():
    ad = SyntheticAdapter()
    h = ad.prepare({})
    ad.release(h)
    with pytest.raises(ValueError):
        ad.run(h, 0)
    h2 = ad.prepare({})
    ad.close()
    with pytest.raises(ValueError):
        ad.greedy(h2, [[1, 2]], 2)


def test_greedy_matches_score_argmax_and_shapes():
    ad = SyntheticAdapter(vocab_size=64)
    h = ad.prepare({})
    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    conts = ad.greedy(h, prompts, 6)
    assert [len(c) for c in conts] == [6, 6]
    lp = ad.score(h, prompts, conts)
    assert lp.dtype == torch.float32 and tuple(lp.shape) == (2, 6, 64)
    assert torch.allclose(lp.exp().sum(-1), torch.ones(2, 6), atol=1e-5)
    assert lp.argmax(-1).tolist() == conts
    assert ad.greedy(h, prompts, 6) == conts  # deterministic
    with pytest.raises(ValueError):
        ad.score(h, prompts, [[1, 2], [3]])
    with pytest.raises(ValueError):
        ad.greedy(h, [[999]], 1)


def test_numerics_perturbation():
    ad = SyntheticAdapter(numerics={"precision": {"bf16": 2.0}})
    stock, same, fast, bf16 = (ad.prepare(c) for c in ({}, {}, {"fast_path": True}, {"precision": "bf16"}))
    prompts = [[i, i + 1, i + 2] for i in range(8)]
    conts = ad.greedy(stock, prompts, 16)
    ref = ad.score(stock, prompts, conts)
    assert ad.greedy(same, prompts, 16) == conts and ad.greedy(fast, prompts, 16) == conts
    assert torch.equal(ad.score(fast, prompts, conts), ref)
    assert ad.greedy(bf16, prompts, 16) != conts
    agree = (ad.score(bf16, prompts, conts).argmax(-1) == ref.argmax(-1)).double().mean().item()
    assert agree < 0.9
    assert ad.numerics_scale({"precision": "bf16"}) == 2.0 and ad.numerics_scale({}) == 0.0


def test_protocol_on_synthetic_adapter():
    ad = SyntheticAdapter(effects={"fast_path": {True: 1.15}}, noise_sd=0.03, seed=2)
    stock, fast = ad.prepare({}), ad.prepare({"fast_path": True})
    res = run_paired(lambda s: ad.run(stock, s), lambda s: ad.run(fast, s), FAST, seed_base=0)
    assert res.verdict == "keep"
    assert res.decision.ci_low <= 1.15 <= res.decision.ci_high
    s2 = ad.prepare({"useless": True})
    res = run_paired(lambda s: ad.run(stock, s), lambda s: ad.run(s2, s), FAST, seed_base=0)
    assert res.verdict != "keep"
    assert math.isfinite(res.decision.ratio)
