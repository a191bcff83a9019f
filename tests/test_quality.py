"""Quality contract: pure checks, and verdicts that name the failed check."""

import math

import pytest
import torch

from inferloom.measure import quality as Q


def logprobs(seed, n=4, t=8, v=32, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(n, t, v, generator=g) * scale, dim=-1)


def test_identical_distributions_agree_fully():
    lp = logprobs(0)
    v = Q.teacher_forced_agreement(lp, lp.clone())
    assert v["top1_agreement"] == 1.0
    assert abs(v["mean_kl"]) < 1e-12


def test_kl_matches_closed_form():
    ref = torch.log(torch.tensor([[[0.5, 0.5]]]))
    cand = torch.log(torch.tensor([[[0.9, 0.1]]]))
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert Q.teacher_forced_agreement(ref, cand)["mean_kl"] == pytest.approx(expected)


def test_perturbed_logits_fail_naming_the_check():
    ref = logprobs(1)
    g = torch.Generator().manual_seed(2)
    noisy = torch.log_softmax(ref + torch.randn(ref.shape, generator=g) * 2.0, dim=-1)
    values = {**Q.teacher_forced_agreement(ref, noisy), "greedy_agreement": 1.0, "exact_match_rate": 1.0}
    verdict = Q.judge("eval", values, Q.QualityThresholds(), n=4, positions=32)
    assert not verdict.passed
    assert verdict.failed_check == "top1_agreement"
    assert "top1_agreement" in verdict.message and "required >= 0.98" in verdict.message


def test_small_perturbation_passes():
    ref = logprobs(3)
    g = torch.Generator().manual_seed(4)
    tiny = torch.log_softmax(ref + torch.randn(ref.shape, generator=g) * 1e-4, dim=-1)
    values = {**Q.teacher_forced_agreement(ref, tiny), "greedy_agreement": 1.0, "exact_match_rate": 1.0}
    assert Q.judge("eval", values, Q.QualityThresholds(), 4, 32).passed


def test_kl_check_fails_when_top1_survives():
    # Same argmax everywhere, but the distribution flattened: only KL catches it.
    ref = logprobs(5, scale=4.0)
    flat = torch.log_softmax(ref * 0.3, dim=-1)
    values = {**Q.teacher_forced_agreement(ref, flat), "greedy_agreement": 1.0, "exact_match_rate": 1.0}
    assert values["top1_agreement"] == 1.0
    verdict = Q.judge("heldout", values, Q.QualityThresholds(), 4, 32)
    assert verdict.failed_check == "mean_kl"


def test_nan_never_passes():
    ref = logprobs(6)
    bad = ref.clone()
    bad[0, 0, 0] = float("nan")
    values = {**Q.teacher_forced_agreement(ref, bad), "greedy_agreement": 1.0, "exact_match_rate": 1.0}
    assert not Q.judge("eval", values, Q.QualityThresholds(), 4, 32).passed


def test_greedy_agreement_prefix_semantics():
    ref = [[1, 2, 3, 4], [5, 6, 7, 8]]
    same = Q.greedy_agreement(ref, ref)
    assert same["greedy_agreement"] == same["greedy_prefix"] == same["exact_match_rate"] == 1.0
    got = Q.greedy_agreement(ref, [[1, 2, 9, 4], [5, 6, 7, 8]])
    # first prompt matches 2 of 4 before diverging (the later match doesn't count)
    assert got["greedy_agreement"] == pytest.approx((0.5 + 1.0) / 2)
    assert got["exact_match_rate"] == 0.5
    assert Q.greedy_agreement([[1, 2]], [[1]])["greedy_agreement"] == 0.5
    with pytest.raises(ValueError):
        Q.greedy_agreement(ref, ref[:1])


def test_greedy_failure_is_named():
    values = {"top1_agreement": 1.0, "mean_kl": 0.0, "max_kl": 0.0, "greedy_agreement": 0.5, "exact_match_rate": 0.0}
    v = Q.judge("eval", values, Q.QualityThresholds(), 2, 8)
    assert v.failed_check == "greedy_agreement" and "0.5" in v.message


def test_tie_breaks_are_not_disagreements_but_clear_flips_are():
    # stock prefers token 0 over 1 by 0.05 nats (a near-tie) and over 2 by 2 nats
    logits = torch.tensor([2.05, 2.0, 0.05, -3.0])
    ref = torch.log_softmax(logits, -1).expand(1, 3, 4).clone()
    picks_1 = torch.log_softmax(torch.tensor([2.0, 2.05, 0.05, -3.0]), -1).expand(1, 3, 4).clone()
    picks_2 = torch.log_softmax(torch.tensor([2.0, 0.0, 2.05, -3.0]), -1).expand(1, 3, 4).clone()
    tie = Q.teacher_forced_agreement(ref, picks_1, tie_margin=0.1)
    assert tie["top1_exact"] == 0.0 and tie["top1_agreement"] == 1.0
    flip = Q.teacher_forced_agreement(ref, picks_2, tie_margin=0.1)
    assert flip["top1_agreement"] == 0.0
    # greedy: a divergence at the near-tie counts as agreement, a clear flip does not
    conts = [[0, 0, 0]]
    assert Q.greedy_agreement(conts, [[0, 1, 3]], ref, 0.1)["greedy_agreement"] == 1.0
    g = Q.greedy_agreement(conts, [[0, 2, 3]], ref, 0.1)
    assert g["greedy_agreement"] == pytest.approx(1 / 3) and g["greedy_prefix"] == pytest.approx(1 / 3)
    # with no margin, both are disagreements
    assert Q.greedy_agreement(conts, [[0, 1, 3]], ref, 0.0)["greedy_agreement"] == pytest.approx(1 / 3)


def test_thresholds_take_every_default_and_bound_from_the_spec():
    """One source per setting: QualitySpec declares each threshold's default and bound."""
    from dataclasses import fields

    from inferloom.spec import QualitySpec

    for f in fields(Q.QualityThresholds):
        assert f.default == QualitySpec.model_fields[f.name].default, f.name
    assert Q.QualityThresholds() == Q.QualityThresholds.from_spec(QualitySpec())
    custom = QualitySpec(min_top1_agreement=0.9, max_mean_kl=0.05, min_greedy_agreement=0.5, tie_margin=0.2)
    assert Q.QualityThresholds.from_spec(custom) == Q.QualityThresholds(0.9, 0.05, 0.5, 0.2)
    with pytest.raises(ValueError, match="quality min_top1_agreement"):
        Q.QualityThresholds(min_top1_agreement=1.5)
    with pytest.raises(ValueError, match="quality max_mean_kl"):
        Q.QualityThresholds(max_mean_kl=-0.1)
