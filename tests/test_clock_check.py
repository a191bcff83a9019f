"""measure/clock_check.py: a custom workload's claimed gain against inferloom's own clock (pure function)."""

import random

from inferloom.measure.clock_check import CLOCK_UNVERIFIABLE, GAIN_NOT_SEEN, clock_check


def _pairs(n, *, timed_a, g, saved, wall=1.0, noise=0.005, seed=0, timed=True):
    """n pairs: A's region takes timed_a s; the objective says B is g times faster; the clock saw `saved` s less."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        wa = wall + rng.gauss(0, noise)
        wb = wall - saved + rng.gauss(0, noise)
        a = {"wall_s": wa, "extra": {"timed_s": timed_a} if timed else {}}
        out.append({"value_a": 100.0, "value_b": 100.0 * g, "a": a, "b": {"wall_s": wb, "extra": {}}})
    return out


def test_a_real_gain_passes_and_a_forged_one_is_refused():
    # a real x2 on a 0.4 s region: the run ends 0.2 s sooner, as claimed
    real = clock_check(_pairs(5, timed_a=0.4, g=2.0, saved=0.2))
    assert real.rule is None and abs(real.claimed_saving_s - 0.2) < 1e-9 and abs(real.observed_saving_s - 0.2) < 0.02
    # a forged x1000 (a patched timer): claims ~0.4 s saved, the clock saw nothing
    forged = clock_check(_pairs(5, timed_a=0.4, g=1000.0, saved=0.0))
    assert forged.rule == GAIN_NOT_SEEN and forged.bound_s < 0 and "less than half" in forged.why
    # a half-forged x2 that really saved only a tenth of what it claims
    assert clock_check(_pairs(5, timed_a=0.4, g=2.0, saved=0.02)).rule == GAIN_NOT_SEEN


def test_noise_larger_than_the_claim_does_not_refuse_a_real_gain():
    # a small real gain under a noisy wall clock: not contradicted (the check refuses only on evidence)
    refused = sum(clock_check(_pairs(3, timed_a=0.02, g=1.3, saved=0.02 * (1 - 1 / 1.3), noise=0.03, seed=s)).rule
                  is not None for s in range(200))
    assert refused <= 6  # alpha = 1% one-sided; 200 seeds
    res = clock_check(_pairs(3, timed_a=0.02, g=1.3, saved=0.0046, noise=0.03))
    assert res.resolution_s > 0.02  # it says it could not resolve a saving that small


def test_without_timed_s_or_pairs_the_gain_is_unverifiable():
    assert clock_check(_pairs(5, timed_a=0.4, g=2.0, saved=0.2, timed=False)).rule == CLOCK_UNVERIFIABLE
    assert "timed_s" in clock_check(_pairs(5, timed_a=0.4, g=2.0, saved=0.2, timed=False)).why
    assert clock_check(_pairs(1, timed_a=0.4, g=2.0, saved=0.2)).rule == CLOCK_UNVERIFIABLE
    assert clock_check([]).rule == CLOCK_UNVERIFIABLE


def test_a_lower_is_better_objective_reads_the_same():
    # the protocol's values are already oriented (higher is better): a latency objective arrives inverted
    p = _pairs(5, timed_a=0.5, g=1.25, saved=0.1)
    assert clock_check(p).rule is None
