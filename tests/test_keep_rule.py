"""The session's keep rule (measure/keep_rule.py): a keep's lower end clears the minimum gain and the A/A
floor together, ``(1 + min_gain)(1 + floor)``, in every path that keeps (the protocol's threshold, the
coordinator, the rule Critic); the A/A floor catches an instance effect and stays out of the way of noise."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from inferloom.agents.rules import RuleCritic
from inferloom.measure.keep_rule import aa_floor, clears_floor, keep_threshold, session_keep
from inferloom.measure.protocol import ProtocolSettings, decision_at, noise_floor, run_paired, sequential_decision, with_prior
from inferloom.workloads.base import RunRecord

S = ProtocolSettings()
# an A/A that resolves an instance effect: stock-2 measured 3% slower, interval [0.965, 0.975]
INSTANCE = {"ratio": 0.97, "ci_low": 0.965, "ci_high": 0.975}


def test_the_floor_is_the_resolved_deviation_plus_half_the_aa_half_width():
    m, h = abs(math.log(0.97)), math.log(0.975 / 0.965) / 2
    assert aa_floor(INSTANCE) == pytest.approx(math.expm1(m + h / 2))
    assert aa_floor({**INSTANCE, "ratio": 1 / 0.97, "ci_low": 1 / 0.975, "ci_high": 1 / 0.965}) == \
        pytest.approx(aa_floor(INSTANCE))  # a faster second instance is a floor as well
    # noise alone (the interval around 1 is wide for the deviation) sets no floor
    assert aa_floor({"ratio": 1.004, "ci_low": 0.985, "ci_high": 1.023}) == 0.0
    # no A/A, or one without a usable ratio: no floor; without an interval: the plain deviation
    assert aa_floor(None) == aa_floor({}) == aa_floor({"ratio": float("nan")}) == aa_floor({"ratio": -1}) == 0.0
    assert aa_floor({"ratio": 0.97}) == pytest.approx(math.expm1(m))


def test_a_gain_within_the_floor_is_refused_and_one_that_clears_it_is_kept():
    floor = aa_floor(INSTANCE)  # about 3.35%
    bar = keep_threshold(0.01, floor)
    assert bar == pytest.approx(1.01 * (1 + floor))
    kw = {"protocol_verdict": "keep", "quality_passed": True, "min_gain": 0.01, "floor": floor}
    # +4%: clears max(min_gain, floor), the rule before, but not the two together: refused
    assert 1.04 - 1 > max(0.01, floor) and not session_keep(ci_low=1.04, **kw)
    assert session_keep(ci_low=bar * 1.001, **kw) and not session_keep(ci_low=bar, **kw)
    # the other conditions still hold
    assert not session_keep(**{**kw, "protocol_verdict": "inconclusive"}, ci_low=1.2)
    assert not session_keep(**{**kw, "quality_passed": None}, ci_low=1.2)
    assert session_keep(**{**kw, "quality_passed": None}, ci_low=1.2, allow_unscored=True)
    assert not any(clears_floor(x, min_gain=0.01, floor=0.0) for x in (None, float("nan"), True, "1.2"))


def test_the_protocol_keeps_only_above_the_floor():
    """The same pairs: kept without a floor, not kept (and not stopped early on a keep) with the A/A floor."""
    rng = np.random.default_rng(5)
    d = math.log(1.04) + 0.004 * rng.standard_normal(S.max_pairs)
    assert sequential_decision(d, S).verdict == "keep"
    s = replace(S, floor=aa_floor(INSTANCE))
    look = sequential_decision(d, s)
    assert look.verdict != "keep" and math.exp(look.lo) <= keep_threshold(S.min_gain, s.floor)
    dec = decision_at(d[:look.n_pairs], s)
    assert dec.floor == s.floor and dec.verdict == look.verdict
    # a gain that clears both is kept, its interval above the joint threshold
    up = sequential_decision(d + math.log(1.05), s)
    assert up.verdict == "keep" and math.exp(up.lo) > keep_threshold(S.min_gain, s.floor)
    assert "A/A floor" in up.reason and "A/A floor" not in sequential_decision(d + math.log(1.05), S).reason


def test_with_prior_carries_the_aa_floor_and_older_settings_read_without_it():
    def run(mult):
        rng = np.random.default_rng(int(mult * 100))
        return lambda seed: RunRecord(config_id=str(mult), seed=seed, success=True,
                                      wall_s=0.1 / (mult * math.exp(0.01 * rng.standard_normal())),
                                      output_tokens=100, expected_output_tokens=100, num_requests=1)
    nf = noise_floor(run_paired(run(1.0), run(0.95), S, seed_base=0, stop_early=False))  # a 5% slower instance
    s = with_prior(S, nf)
    assert s.floor == aa_floor(nf) > 0.04
    res = run_paired(run(1.0), run(1.02), s, seed_base=100)  # +2% is within the floor: never kept
    assert res.settings["floor"] == s.floor and res.verdict != "keep"
    old = {k: v for k, v in S.to_dict().items() if k != "floor"}
    assert ProtocolSettings(**old).floor == 0.0
    with pytest.raises(ValueError, match="floor"):
        ProtocolSettings(floor=-0.1)


def test_the_rule_critic_applies_the_same_rule():
    ev = {"changes": {"k": 1}, "protocol_verdict": "keep", "ratio": 1.06, "ci_low": 1.04, "ci_high": 1.08,
          "n_pairs": 10, "quality_passed": True, "quality_failed": [], "noise_floor": 0.0335, "min_gain": 0.01}
    out = RuleCritic().judge(ev)
    assert out["decision"] == "revert" and "on top of the minimum gain 1.0%" in out["lesson"]
    assert RuleCritic().judge({**ev, "ci_low": 1.05})["decision"] == "keep"
    # evidence without min_gain (an older caller): the floor alone, as before
    assert RuleCritic().judge({k: v for k, v in ev.items() if k != "min_gain"})["decision"] == "keep"
