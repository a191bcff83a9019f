"""The harm stop (issue 31 follow-up): before the first look, revert a candidate whose every pair so far is
grossly slower. Its pure rule (table-driven), its error bound, the protocol's run that ends on it, the record,
``inferloom verify``'s re-derivation of it, the Critic's lesson, and the published H200 trial it would have
cut short."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from inferloom.agents.rule_critic import RuleCritic
from inferloom.measure.protocol import ProtocolSettings, first_harm_stop, harm_stop, run_paired
from inferloom.measure.sequential import (HARM_ERROR, HARM_FALLBACK_SD, HARM_MIN_PAIRS, harm_error_at, harm_look,
                                          harm_z)
from inferloom.spec import ProtocolSpec
from inferloom.verify import sequential as V
from inferloom.verify.measurements import check_measurement
from inferloom.verify.record import Findings
from inferloom.workloads.base import RunRecord

L = math.log
S = ProtocolSettings()  # min_pairs 6: harm checks after pairs 2..5
S31 = Path(__file__).resolve().parents[1] / "docs/results/smollm2-h200-vllm-2026-12-02/s31/ledger.jsonl"

# (log-ratios, harm_ratio, A/A sd (None: no A/A), stops?, what it shows)
CASES = [
    ([L(0.03)], 0.5, 0.01, False, "one pair never stops (a one-off slow first run)"),
    ([L(0.03), L(0.03)], 0.5, 0.01, True, "two pairs both 30x slower on a quiet machine"),
    ([L(0.45), L(0.45)], 0.5, 0.01, True, "below the harm ratio, quiet machine: the ratio decides"),
    ([L(0.55), L(0.55)], 0.5, 0.01, False, "above the harm ratio: the regular looks decide"),
    ([L(0.03), L(0.9)], 0.5, 0.01, False, "every pair must be below, not the mean"),
    ([L(0.46), L(0.46)], 0.5, 0.12, False, "noisier A/A (sd 0.12): 6.6 sd below 1 is x0.452"),
    ([L(0.40), L(0.40)], 0.5, 0.12, True, "x0.40 clears it at that noise"),
    ([L(0.40), L(0.40)], 0.5, None, False, "no A/A: the 0.5 fallback sd needs x0.037 at 2 pairs"),
    ([L(0.03), L(0.03)], 0.5, None, True, "no A/A, 30x slower: stops"),
    ([L(0.2)] * 3, 0.5, None, False, "no A/A, 3 pairs at x0.2: the bound is x0.145"),
    ([L(0.1)] * 3, 0.5, None, True, "... x0.1 clears it"),
    ([L(0.03), L(0.03)], 0.0, 0.01, False, "harm_ratio 0 disables it"),
    ([L(0.3), L(0.03)], 0.5, 0.01, False, "the pairs' own spread (sd 1.6) is the noise too"),
]


@pytest.mark.parametrize("d, h, sd, stops, why", CASES, ids=[c[-1] for c in CASES])
def test_harm_rule_table(d, h, sd, stops, why):
    hk = harm_look(d, harm_ratio=h, prior_sd=sd)
    got = bool(hk and hk.stop)
    assert got == stops, why
    if hk is not None:
        assert hk.bound <= L(h) and hk.sd >= (sd if sd is not None else HARM_FALLBACK_SD)
        assert hk.reason.startswith("revert (harm)" if got else "continue")
        r = V.recompute_harm(d, {"design": "sequential", "harm_ratio": h, "prior_sd": sd, "min_pairs": len(d) + 1})
        assert (r is not None) == got  # verify's own code agrees
        if r is not None:
            assert r.bound == pytest.approx(hk.bound, rel=1e-12) and r.sd == pytest.approx(hk.sd, rel=1e-12)


def test_the_error_shares_sum_to_the_bound_and_cantelli_holds():
    shares = [harm_error_at(k) for k in range(HARM_MIN_PAIRS, 200)]
    assert sum(shares) <= HARM_ERROR * (1 + 1e-12) and shares[0] == HARM_ERROR / 2
    for k in range(HARM_MIN_PAIRS, 30):  # every pair k sds below: (1 / (1 + z^2))^k is the share
        z = harm_z(k)
        assert (1.0 / (1.0 + z * z)) ** k == pytest.approx(harm_error_at(k), rel=1e-9)
    assert harm_z(2) == pytest.approx(6.61, abs=0.01)


def test_a_worst_case_heavy_tail_stays_under_the_bound():
    """A null (true ratio 1) whose per-pair law puts the most mass Cantelli allows far below 0: a two-point
    law scaled so its sd is exactly the A/A's. The harm stop's rate over 200k sessions stays under 0.1%."""
    rng = np.random.default_rng(7)
    sd, n, k_max = 0.15, 200_000, S.min_pairs - 1  # 6.6 sd: below the harm ratio's x0.5
    z2 = harm_z(2)
    p = 1.0 / (1.0 + z2 * z2)  # the mass Cantelli allows below -z2 sd at pair 2
    lo, hi = -z2 * sd * 1.0001, sd * sd / (z2 * sd)  # mean 0, sd <= sd
    d = np.where(rng.random((n, k_max)) < p, lo, hi)
    s = replace(S, prior_sd=sd, prior_df=29)
    stops = sum(first_harm_stop(row, s) is not None for row in d[d[:, 0] < 0])
    assert 0 < stops / n <= HARM_ERROR  # about p^2 = 0.049%: the two-pair share, the bound's largest


def _source(ratio: float, noise: float, seed: int):
    rng = np.random.default_rng(seed)

    def make(mult: float):
        def run(s: int) -> RunRecord:
            tps = 1000.0 * mult * math.exp(noise * rng.standard_normal())
            return RunRecord(config_id=str(mult), seed=s, success=True, wall_s=100.0 / tps, output_tokens=100,
                             expected_output_tokens=100, num_requests=1)
        return run
    return make(1.0), make(ratio)


def _entry(res, seq=7):
    return {"seq": seq, "action": "try_config", "verdict": res.verdict, "protocol": res.to_dict()}


def test_run_paired_stops_a_serialized_candidate_at_pair_two_and_verify_rederives_it():
    s = replace(S, prior_sd=0.02, prior_df=29)
    res = run_paired(*_source(0.03, 0.01, 1), s, seed_base=100)
    assert res.verdict == "revert" and len(res.pairs) == 2 and len(res.looks) == 1
    dec = res.decision
    assert dec.stop == "harm" and dec.method == "harm" and "(harm)" in dec.reason and not dec.final
    assert dec.ci_high < dec.harm_bound <= 0.5 and dec.harm_sd >= 0.02 and dec.ci_low <= dec.ratio <= dec.ci_high
    f = Findings()
    check_measurement(f, _entry(res), "trial")
    assert f.checks and not f.mismatches, f.mismatches
    assert any(c.name == "harm stop before the first look" for c in f.checks)
    # a tampered record: the run continued past a harm stop, or a harm stop recorded where none applies
    bad = _entry(res)
    bad["protocol"]["decision"]["harm_bound"] = 0.9
    bad["protocol"]["looks"][0]["harm_bound"] = 0.9
    f = Findings()
    check_measurement(f, bad, "trial")
    assert [c.name for c in f.mismatches] == ["harm stop (n=2) harm_bound"]
    off = run_paired(*_source(0.03, 0.01, 1), replace(s, harm_ratio=0.0), seed_base=100)
    assert len(off.pairs) == S.min_pairs and off.decision.stop == "below_min_gain"
    e = _entry(off)
    e["protocol"]["settings"]["harm_ratio"] = 0.5  # claims the stop was on: it should have stopped at 2
    f = Findings()
    check_measurement(f, e, "trial")
    assert "harm stop before the first look" in [c.name for c in f.mismatches]


def test_a_null_or_a_gain_runs_to_the_first_look_and_verifies():
    for ratio in (1.0, 1.05):
        res = run_paired(*_source(ratio, 0.03, 3), replace(S, prior_sd=0.04, prior_df=29), seed_base=0)
        assert len(res.pairs) >= S.min_pairs and all(lk.stop != "harm" for lk in res.looks)
        f = Findings()
        check_measurement(f, _entry(res), "trial")
        assert not f.mismatches, f.mismatches


def test_the_aa_and_the_bonferroni_design_never_harm_stop():
    aa = run_paired(*_source(0.03, 0.01, 2), S, seed_base=0, stop_early=False)
    assert len(aa.pairs) == S.max_pairs and all(lk.stop != "harm" for lk in aa.looks)
    bonf = ProtocolSettings(design="bonferroni", confidence=0.95, min_pairs=5, max_pairs=15, pair_step=2)
    assert harm_stop([L(0.03)] * 3, bonf) is None
    assert harm_stop([L(0.03)] * S.min_pairs, S) is None  # at the first look the regular design decides


def test_the_spec_field_and_its_bounds():
    assert ProtocolSpec().harm_ratio == 0.5 == S.harm_ratio and ProtocolSpec(harm_ratio=0).harm_ratio == 0
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError):
            ProtocolSettings(harm_ratio=bad)


def test_the_critic_says_harm():
    res = run_paired(*_source(0.03, 0.01, 1), replace(S, prior_sd=0.02, prior_df=29), seed_base=100)
    d = res.decision
    ev = {"changes": {"max_num_seqs": 1}, "protocol_verdict": "revert", "ratio": d.ratio, "ci_low": d.ci_low,
          "ci_high": d.ci_high, "n_pairs": d.n_pairs, "quality_passed": None, "noise_floor": 0.0, "min_gain": 0.01,
          "protocol_reason": d.reason}
    out = RuleCritic().judge(ev)
    assert out["decision"] == "revert" and "harm stop" in out["lesson"] and "over 2 pairs" in out["lesson"]


def test_the_published_h200_trial_would_have_stopped_after_two_pairs():
    """docs/benchmarks.md section 18, trial 2 (max_num_seqs=1 at c64): 3 pairs of ~75 s candidate runs. With the
    session's own A/A sd (0.119, 7 pairs) in the settings the harm stop reverts after pair 2."""
    entries = [json.loads(x) for x in S31.read_text().splitlines() if x.strip()]
    aa = next(e for e in entries if e.get("action") == "measure_stock" and e.get("noise"))
    trial = next(e for e in entries if e.get("action") == "try_config" and e.get("verdict") == "revert"
                 and len(e["protocol"]["pairs"]) == 3)
    st = trial["protocol"]["settings"]
    assert "harm_ratio" not in st  # written before the harm stop: verify reads it as off
    s = ProtocolSettings(min_pairs=st["min_pairs"], max_pairs=st["max_pairs"], pair_step=st["pair_step"],
                         prior_sd=aa["noise"]["sd_log_ratio"], prior_df=aa["noise"]["n_pairs"] - 1)
    d = [p["log_ratio"] for p in trial["protocol"]["pairs"]]
    assert harm_stop(d[:1], s) is None
    dec = harm_stop(d[:2], s)
    assert dec is not None and dec.n_pairs == 2 and dec.harm_bound == pytest.approx(0.454, abs=0.002)
