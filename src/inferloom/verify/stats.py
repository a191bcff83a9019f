"""The statistics ``inferloom verify`` re-derives, written again from the
protocol's published contract (``docs/protocol.md``), not imported from it.

Per measurement: the paired log-ratios ``log(value_b) - log(value_a)``; the
effect ``exp(mean)``; the Student-t interval of the mean at the per-look level
``1 - (1 - confidence) / n_looks`` (Bonferroni over the planned looks
``min_pairs, min_pairs + pair_step, ..., max_pairs``); the bootstrap interval
of the mean, recomputed with :func:`scipy.stats.bootstrap` resampling *pairs*
(``paired=True`` over the raw values), BCa with the percentile method when BCa
is undefined; the interval used is their union when the t guard is on; the
rule keeps iff the lower bound exceeds ``log(1 + min_gain)``, reverts iff the
upper bound is below it, else continues (inconclusive at the last look).

Monte-Carlo tolerance of a bootstrap endpoint (:func:`mc_band`). A bootstrap
endpoint is random through its resamples: the recorded one is one draw (seed
``bootstrap_seed``) from the distribution of endpoints over seeds. The check
recomputes the endpoint with the recorded seed first: an equal value (1e-9
relative) is a bit-for-bit reproduction. Otherwise (another scipy or numpy
may draw differently) it draws ``K = MC_SEEDS`` endpoints with fresh seeds,
same data, statistic, level, method and number of resamples; treating the
recorded endpoint as one more exchangeable draw, its 99.99% prediction band is
``mean +- t(K-1, 0.99995) * sd * sqrt(1 + 1/K)`` (log scale), widened to the
range of the K draws (an endpoint is an order statistic of the resampled means,
so with few pairs it takes a few discrete values and ``sd`` can be 0).
"""

from __future__ import annotations

import inspect
import math
import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats

__all__ = ["MC_SEEDS", "MC_LEVEL", "REL_TOL", "Recomputed", "planned_looks", "paired_log_ratios", "t_interval",
           "bootstrap_interval", "rule", "recompute", "mc_band", "close"]

#: fresh seeds drawn for the Monte-Carlo band of a bootstrap endpoint
MC_SEEDS = 12
#: two-sided level of the prediction band of one endpoint
MC_LEVEL = 0.9999
#: relative tolerance of a number that is a deterministic function of the ledger
REL_TOL = 1e-9

_RNG_KW = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"


def close(a: float | None, b: float | None, rel: float = REL_TOL) -> bool:
    """Equal to ``rel`` relative (and 1e-12 absolute, for values near 0)."""
    if a is None or b is None:
        return a is b
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=1e-12)


def planned_looks(min_pairs: int, max_pairs: int, pair_step: int) -> list[int]:
    """The pair counts examined: ``min_pairs`` then every ``pair_step``, always ending at ``max_pairs``."""
    out = []
    n = min_pairs
    while n < max_pairs:
        out.append(n)
        n += pair_step
    out.append(max_pairs)
    return out


def paired_log_ratios(a: Sequence[float], b: Sequence[float]) -> np.ndarray:
    """``log(b_i / a_i)`` per pair: the protocol's own per-pair definition, bit for bit (``log(b) - log(a)``
    rounds differently, and at a few pairs a bootstrap quantile then lands on a neighbouring resample)."""
    return np.log(np.asarray(b, dtype=float) / np.asarray(a, dtype=float))


def t_interval(d: np.ndarray, level: float) -> tuple[float, float]:
    """Student-t interval of the mean of ``d`` at two-sided ``level`` (log scale)."""
    n = d.size
    mean = math.fsum(d.tolist()) / n
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in d.tolist()) / (n - 1))
    half = float(stats.t.ppf((1.0 + level) / 2.0, n - 1)) * sd / math.sqrt(n)
    return mean - half, mean + half


def _mean_log_ratio(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(np.log(b / a), axis=axis)


def bootstrap_interval(a: Sequence[float], b: Sequence[float], level: float, resamples: int,
                       seed: int) -> tuple[float, float, str]:
    """The bootstrap interval of the mean log-ratio, resampling pairs (log scale), and its method."""
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # degenerate (constant) data: BCa undefined
            res = stats.bootstrap((xa, xb), _mean_log_ratio, paired=True, vectorized=True, n_resamples=resamples,
                                  confidence_level=level, method=method,
                                  **{_RNG_KW: np.random.default_rng(seed)})
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(lo) and math.isfinite(hi):
            return lo, hi, method
    return -math.inf, math.inf, "none"


def rule(lo: float, hi: float, min_gain: float, final: bool) -> str:
    """keep iff ``lo > log(1 + min_gain)``; revert iff ``hi < log(1 + min_gain)``; else continue / inconclusive."""
    g = math.log(1.0 + min_gain)
    if lo > g:
        return "keep"
    if hi < g:
        return "revert"
    return "inconclusive" if final else "continue"


@dataclass(frozen=True)
class Recomputed:
    """One look recomputed from the pairs' values (bounds on the log scale)."""

    n_pairs: int
    mean_log: float
    sd_log: float
    ratio: float
    level: float
    t_lo: float | None
    t_hi: float | None
    boot_lo: float
    boot_hi: float
    method: str
    lo: float
    hi: float
    verdict: str


def recompute(a: Sequence[float], b: Sequence[float], *, confidence: float, n_looks: int, min_gain: float,
              resamples: int, seed: int, t_guard: bool, final: bool) -> Recomputed:
    """The look on pairs ``(a_i, b_i)``: point estimate, intervals and verdict."""
    d = paired_log_ratios(a, b)
    n = d.size
    mean = math.fsum(d.tolist()) / n
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in d.tolist()) / (n - 1))
    level = 1.0 - (1.0 - confidence) / n_looks
    blo, bhi, method = bootstrap_interval(a, b, level, resamples, seed)
    t_lo = t_hi = None
    lo, hi = blo, bhi
    if t_guard:
        t_lo, t_hi = t_interval(d, level)
        lo, hi = min(blo, t_lo), max(bhi, t_hi)
    return Recomputed(n_pairs=n, mean_log=mean, sd_log=sd, ratio=math.exp(mean), level=level, t_lo=t_lo, t_hi=t_hi,
                      boot_lo=blo, boot_hi=bhi, method=method, lo=lo, hi=hi,
                      verdict=rule(lo, hi, min_gain, final))


def mc_band(a: Sequence[float], b: Sequence[float], level: float, resamples: int,
            seed: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """The Monte-Carlo acceptance band (log scale) of each bootstrap endpoint: ``((lo_min, lo_max), (hi_min,
    hi_max))`` from ``MC_SEEDS`` fresh seeds (never ``seed``), see the module docstring."""
    draws = np.array([bootstrap_interval(a, b, level, resamples, seed + 1 + k)[:2] for k in range(MC_SEEDS)])
    q = float(stats.t.ppf((1.0 + MC_LEVEL) / 2.0, MC_SEEDS - 1)) * math.sqrt(1.0 + 1.0 / MC_SEEDS)
    bands = []
    for col in draws.T:
        m, s = float(col.mean()), float(col.std(ddof=1))
        bands.append((min(m - q * s, float(col.min())), max(m + q * s, float(col.max()))))
    return bands[0], bands[1]
