"""The server's own A/A disagreement as the quality floor (measure/quality_floor.py):
the rule on the H200's measured numbers (FACTS.md, 2026-11-30), the guard rails,
the precision tolerance, and a calibration on real log-prob tensors: an A/A-level
difference passes, real damage fails."""

from __future__ import annotations

import pytest
import torch

from inferloom.measure import quality as Q
from inferloom.measure.quality_floor import (
    HARD_LIMITS,
    apply_floor,
    candidate_thresholds,
    floor_from_quality,
)
from inferloom.spec import load_spec

# two identical fp8 vLLM servers on one H200, held-out set (FACTS.md, 2026-11-30)
H200_AA = {"top1_agreement": 0.9609, "mean_kl": 0.0495, "greedy_agreement": 0.875}


def _quality(**more):
    return load_spec(None, {f"quality.{k}": v for k, v in more.items()}).quality


def _judge(values, th):
    return Q.judge("heldout", values, th, 8, 256)


def test_a_server_that_fails_the_fixed_threshold_against_itself_passes_over_its_own_floor():
    q = _quality()
    # a candidate exactly as far from stock as stock's second instance: the fixed contract rejects it ...
    fixed = _judge(H200_AA, Q.QualityThresholds.from_spec(q))
    assert not fixed.passed and fixed.failed_check == "top1_agreement"
    # ... the floor does not: its disagreement is the server's own
    th, info = candidate_thresholds(q, H200_AA, {}, {})
    assert _judge(H200_AA, th).passed
    assert th.min_top1_agreement == pytest.approx(0.9609 - 0.02)
    assert th.max_mean_kl == pytest.approx(0.0495 + 0.01)
    assert th.min_greedy_agreement == pytest.approx(0.875 - 0.2)
    assert info["floor"] == H200_AA and info["capped"] == [] and info["tolerance"] == "exact"
    assert info["declared"]["min_top1_agreement"] == 0.98 and info["used"]["min_top1_agreement"] < 0.98


def test_real_damage_still_fails_over_the_floor():
    th, _ = candidate_thresholds(_quality(), H200_AA, {}, {})
    # a little worse than the server's own noise allows on each check, one at a time
    for check, value in (("top1_agreement", 0.93), ("mean_kl", 0.07), ("greedy_agreement", 0.6)):
        v = _judge({**H200_AA, check: value}, th)
        assert not v.passed and v.failed_check == check, v.message
    # broken output: far outside
    assert not _judge({"top1_agreement": 0.05, "mean_kl": 4.0, "greedy_agreement": 0.0}, th).passed


def test_a_perfect_aa_leaves_the_declared_contract_and_a_floor_never_tightens_it():
    q = _quality()
    th, info = candidate_thresholds(q, {"top1_agreement": 1.0, "mean_kl": 0.0, "greedy_agreement": 1.0}, {}, {})
    assert th == Q.QualityThresholds.from_spec(q) and info["used"] == info["declared"]
    none, info = candidate_thresholds(q, None, {}, {})
    assert none == Q.QualityThresholds.from_spec(q) and info["floor"] is None


def test_a_broken_aa_cannot_open_the_gate_past_the_hard_limits():
    broken_aa = {"top1_agreement": 0.2, "mean_kl": 3.0, "greedy_agreement": 0.0}
    th, info = apply_floor(Q.QualityThresholds(), broken_aa)
    assert th.min_top1_agreement == HARD_LIMITS["min_top1_agreement"]
    assert th.max_mean_kl == HARD_LIMITS["max_mean_kl"]
    assert th.min_greedy_agreement == HARD_LIMITS["min_greedy_agreement"]
    assert sorted(info["capped"]) == ["greedy_agreement", "mean_kl", "top1_agreement"]
    assert not _judge({"top1_agreement": 0.6, "mean_kl": 1.0, "greedy_agreement": 0.3}, th).passed
    # values that are no measurement are ignored, check by check
    th2, info2 = apply_floor(Q.QualityThresholds(), {"top1_agreement": float("nan"), "mean_kl": -1.0,
                                                     "greedy_agreement": True})
    assert th2 == Q.QualityThresholds() and sorted(info2["ignored"]) == ["greedy_agreement", "mean_kl",
                                                                          "top1_agreement"]


def test_a_numerics_change_is_judged_by_the_declared_numerics_tolerance_over_the_floor():
    stock = {"quantization": "default", "max_num_seqs": 0, "dtype": "auto"}
    fp8 = {**stock, "quantization": "fp8", "max_num_seqs": 8}
    q = _quality(numerics={"min_top1_agreement": 0.95, "max_mean_kl": 0.05, "min_greedy_agreement": 0.6})
    th, info = candidate_thresholds(q, None, stock, fp8)
    assert (th.min_top1_agreement, th.max_mean_kl, th.min_greedy_agreement) == (0.95, 0.05, 0.6)
    assert th.tie_margin == q.tie_margin and info["tolerance"] == "numerics" and "quantization" in info["tolerance_why"]
    th, info = candidate_thresholds(q, H200_AA, stock, fp8)
    assert th.max_mean_kl == pytest.approx(0.0995) and info["tolerance"] == "numerics"
    # a change of no numerics knob: the contract's own thresholds, over the floor
    th, info = candidate_thresholds(q, None, stock, {**stock, "max_num_seqs": 8})
    assert th == Q.QualityThresholds.from_spec(q) and info["tolerance"] == "exact"
    # no declared numerics tolerance: the contract's own thresholds (fail-closed), said so
    th, info = candidate_thresholds(_quality(), None, stock, fp8)
    assert th == Q.QualityThresholds.from_spec(_quality()) and "no quality.numerics" in info["tolerance_why"]


def test_floor_from_the_aa_compare_record():
    q = {"evaluated": True, "passed": False, "sets": [
        {"set_name": "eval", "values": {"top1_agreement": 0.99, "mean_kl": 0.01, "greedy_agreement": 0.9,
                                        "top1_exact": 0.97}},
        {"set_name": "heldout", "values": {**H200_AA, "mean_kl": float("inf")}}]}
    assert floor_from_quality(q) == {"eval": {"top1_agreement": 0.99, "mean_kl": 0.01, "greedy_agreement": 0.9},
                                     "heldout": {"top1_agreement": 0.9609, "greedy_agreement": 0.875}}
    assert floor_from_quality({"evaluated": False}) == {} and floor_from_quality(None) == {}


# ------------------------------------------------------ calibration on tensors
def _logprobs(logits):
    return torch.log_softmax(logits.double(), -1)


def test_calibration_on_log_probs_an_aa_level_difference_passes_and_damage_fails():
    """Stock log-probs of a random-weights model (logit std 3, as the presets);
    a second instance = stock + batch-level noise; the candidate the same kind
    of noise again (passes over the floor), then real damage (fails)."""
    g = torch.Generator().manual_seed(0)
    n, t, v = 8, 32, 2048
    logits = 3.0 * torch.randn(n, t, v, generator=g)
    ref = _logprobs(logits)

    def noisy(std, seed):
        return _logprobs(logits + std * torch.randn(n, t, v, generator=torch.Generator().manual_seed(seed)))

    def measure(cand):
        vals = Q.teacher_forced_agreement(ref, cand, 0.1)
        vals["greedy_agreement"] = vals["top1_agreement"]  # the greedy path is judged the same way here
        return vals

    aa = measure(noisy(0.15, 1))
    assert aa["top1_agreement"] < 0.98  # the fixed contract would reject stock against itself
    th, _ = candidate_thresholds(_quality(), aa, {}, {})
    same = measure(noisy(0.15, 2))
    assert not _judge(same, Q.QualityThresholds()).passed and _judge(same, th).passed
    for damaged in (noisy(0.3, 3),  # an error twice the server's own noise (a wrong kernel, a bad scale)
                    _logprobs(logits[torch.randperm(n, generator=g)]),  # another prompt's outputs
                    _logprobs(3.0 * torch.randn(n, t, v, generator=g))):  # garbage weights
        vals = measure(damaged)
        assert not _judge(vals, th).passed, vals
