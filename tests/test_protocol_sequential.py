"""The sequential design: properties of its pure decision, its boundaries against known values and
against verify's independent quadrature, and a small seeded simulation bounding the false-keep rate."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings as hsettings, strategies as st
from scipy import stats

from inferloom.measure.protocol import (ProtocolSettings, noise_floor, planned_looks, run_paired, sequential_decision,
                                        with_prior)
from inferloom.measure.sequential import budget, keep_boundaries, trimmed_stats
from inferloom.verify import sequential as V
from inferloom.workloads.base import RunRecord

S = ProtocolSettings()
G = math.log1p(S.min_gain)
series = st.lists(st.floats(-0.3, 0.3, allow_nan=False, allow_infinity=False), min_size=6, max_size=30)


@hsettings(max_examples=60, deadline=None)
@given(series, st.floats(0.001, 0.2))
def test_decision_is_pure_and_a_higher_gain_never_loses_a_keep(d, shift):
    a, b = sequential_decision(d, S), sequential_decision(d, S)
    assert a == b
    assert a.lo <= a.mean <= a.hi and a.verdict in ("keep", "revert", "continue", "inconclusive")
    assert S.min_pairs <= a.budget <= S.max_pairs and 0 < a.alpha_spent <= S.alpha + 1e-15
    assert (a.verdict == "keep") == (a.lo > G) and a.reason.startswith(a.verdict.split()[0])
    up = sequential_decision([x + shift for x in d], S)
    if a.verdict == "keep" and up.n_pairs == a.n_pairs:
        assert up.verdict == "keep"
    if up.n_pairs == a.n_pairs:  # same look: the interval moves with the data, its width does not
        assert up.mean == pytest.approx(a.mean + shift) and up.se == pytest.approx(a.se, abs=1e-12)


@hsettings(max_examples=60, deadline=None)
@given(series)
def test_trimmed_statistic_is_order_free_and_matches_verify(d):
    m, se, df = trimmed_stats(np.asarray(d), S.trim)
    m2, se2, df2 = trimmed_stats(np.asarray(sorted(d, reverse=True)), S.trim)
    assert (m, df) == (m2, df2) and se == pytest.approx(se2, rel=1e-12, abs=1e-15)
    vm, vse, vdf = V.trimmed(d, S.trim)
    assert m == pytest.approx(vm, abs=1e-12) and se == pytest.approx(vse, rel=1e-9, abs=1e-15) and df == vdf


@hsettings(max_examples=40, deadline=None)
@given(st.floats(0.001, 0.2), st.floats(0.001, 0.2))
def test_budget_follows_the_noise(s1, s2):
    kw = dict(alpha=S.alpha, power=S.power, min_gain=S.min_gain, target_gain=S.target_gain,
              min_pairs=S.min_pairs, max_pairs=S.max_pairs)
    lo, hi = sorted((s1, s2))
    assert S.min_pairs <= budget(lo, **kw) <= budget(hi, **kw) <= S.max_pairs


def test_boundaries_known_values_and_verify_agrees():
    assert keep_boundaries((10,), (0.01,))[0] == pytest.approx(stats.norm.isf(0.01), abs=1e-9)
    # Lan-DeMets O'Brien-Fleming spending, two equal looks, one-sided 0.025: 2.772, 1.979 (published)
    a1 = float(2 * stats.norm.sf(stats.norm.isf(0.025) / math.sqrt(0.5))) / 2
    c = keep_boundaries((1, 2), (a1, 0.025))
    assert c == pytest.approx((2.772, 1.979), abs=2e-3)
    looks = tuple(planned_looks(S))
    cum = tuple(S.alpha * (n / S.max_pairs) ** S.spending_power for n in looks)
    assert keep_boundaries(looks, cum) == pytest.approx(tuple(V.boundaries(looks, cum)), abs=1e-6)
    assert keep_boundaries(looks, cum)[-1] > stats.norm.isf(S.alpha)  # the looks cost something at the end


def test_a_stall_is_trimmed_away():
    rng = np.random.default_rng(3)
    d = list(math.log(1.06) + 0.02 * rng.standard_normal(22))
    base = sequential_decision(d, S)
    d[5] = math.log(1 / 1.4)  # one run 40% slower
    assert base.verdict == sequential_decision(d, S).verdict == "keep"


def test_every_verdict_says_why_it_stopped():
    def d(mean: float, sd: float, seed: int) -> list[float]:
        return list(mean + sd * np.random.default_rng(seed).standard_normal(30))

    keep = sequential_decision(d(0.1, 0.01, 0), S)
    futile = sequential_decision(d(0.0, 0.03, 1), S)
    unsure = sequential_decision(d(0.025, 0.04, 0), S)
    assert (keep.verdict, keep.stop) == ("keep", "efficacy") and "clears the minimum gain" in keep.reason
    assert (futile.verdict, futile.stop) == ("revert", "futility") and "out of reach" in futile.reason
    assert futile.n_pairs < S.max_pairs
    assert (unsure.verdict, unsure.stop) == ("inconclusive", "budget") and "budget" in unsure.reason


def _naive_peeking_keep(d: np.ndarray, alpha: float) -> bool:
    """A fixed-n one-sided t-test at ``alpha`` looked at after every pair: the error the design prevents."""
    for n in range(3, d.size + 1):
        x = d[:n]
        if (x.mean() - G) / (x.std(ddof=1) / math.sqrt(n)) > stats.t.isf(alpha, n - 1):
            return True
    return False


def test_false_keep_rate_is_bounded_where_naive_peeking_is_not():
    """Seeded, 300 trials at a true gain of exactly min_gain (3% noise per run): the design keeps at most
    3% (nominal 1%; 9 of 300 is > 3 standard errors above 1%); a t-test peeking at every pair keeps far
    more and fails the same bound."""
    rng = np.random.default_rng(2024)
    trials = 300
    d = G + 0.03 * math.sqrt(2) * rng.standard_normal((trials, S.max_pairs))
    keeps = sum(sequential_decision(d[i], S).verdict == "keep" for i in range(trials))
    naive = sum(_naive_peeking_keep(d[i], S.alpha) for i in range(trials))
    assert keeps / trials <= 0.03, keeps
    assert naive / trials > 0.03, naive


def _source(ratio: float, rng: np.random.Generator, noise: float):
    def make(mult: float):
        def run(seed: int) -> RunRecord:
            tps = 1000.0 * mult * math.exp(noise * rng.standard_normal())
            return RunRecord(config_id=str(mult), seed=seed, success=True, wall_s=100.0 / tps,
                             output_tokens=100, expected_output_tokens=100, num_requests=1)
        return run
    return make(1.0), make(ratio)


def test_run_paired_uses_the_prior_and_records_it():
    a, b = _source(1.0, np.random.default_rng(1), 0.01)
    aa = run_paired(a, b, S, seed_base=0, stop_early=False)
    nf = noise_floor(aa)
    s = with_prior(S, nf)
    assert (s.prior_sd, s.prior_df) == (nf["sd_log_ratio"], 29)
    assert with_prior(replace(S, design="bonferroni"), nf).prior_sd is None and with_prior(S, None) == S
    a, b = _source(1.0, np.random.default_rng(2), 0.01)
    res = run_paired(a, b, s, seed_base=100)
    assert res.settings["prior_sd"] == nf["sd_log_ratio"]
    # at 1% noise the budget is small: the run stops well before max_pairs, saying why
    assert len(res.pairs) < S.max_pairs and res.decision.reason and res.decision.stop in ("futility", "budget")
