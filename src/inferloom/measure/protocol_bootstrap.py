"""The earlier decision design (``design: bonferroni``): at each of the planned
looks a bootstrap interval of the mean paired log-ratio (BCa, percentile when
BCa is undefined; a recorded seed), united with the Student-t interval at the
same level (the small-sample guard), at the Bonferroni-corrected level
``1 - (1 - confidence) / n_looks``. Keep iff the lower bound clears
``log(1 + min_gain)``, revert iff the upper bound is below it. Results written
before the sequential design read, report and verify with this one; the
protocol module's docstring has the full contract."""

from __future__ import annotations

import inspect
import math
import warnings
from typing import Sequence

import numpy as np
from scipy import stats

from inferloom.measure.protocol_types import Decision, ProtocolSettings, Verdict

__all__ = ["decide"]

# scipy >= 1.15 takes ``rng``; older versions take ``random_state``.
_RNG_KW = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"


def _bootstrap_ci(d: np.ndarray, conf: float, settings: ProtocolSettings) -> tuple[float, float, str]:
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DegenerateDataWarning / RuntimeWarning on constant data
            res = stats.bootstrap(
                (d,), np.mean, n_resamples=settings.bootstrap_resamples, confidence_level=conf,
                method=method, vectorized=True,
                **{_RNG_KW: np.random.default_rng(settings.bootstrap_seed)},
            )
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(lo) and math.isfinite(hi):
            return lo, hi, method
    # Unreachable for finite data (percentile bounds are order statistics of means),
    # kept so a surprise can never read as a confident decision.
    return -math.inf, math.inf, "none"


def decide(
    log_ratios: Sequence[float],
    settings: ProtocolSettings,
    *,
    final: bool,
    n_looks: int,
) -> Decision:
    """Decide on paired log-ratios ``log(B/A)``. Pure: same input, same output.

    ``n_looks`` is the number of planned looks (Bonferroni correction);
    ``final`` turns "continue" into "inconclusive"; the threshold is
    ``settings.min_gain``. Needs at least two finite values.
    """
    d = np.asarray(list(log_ratios), dtype=float)
    if d.ndim != 1 or d.size < 2:
        raise ValueError(f"decide: need at least 2 paired log-ratios, got {d.size}")
    if not np.all(np.isfinite(d)):
        raise ValueError("decide: log-ratios must be finite")
    if n_looks < 1:
        raise ValueError(f"decide: n_looks must be >= 1, got {n_looks}")
    gain = settings.min_gain
    conf_look = 1.0 - (1.0 - settings.confidence) / n_looks
    mean = float(d.mean())
    sd = float(d.std(ddof=1))
    blo, bhi, method = _bootstrap_ci(d, conf_look, settings)
    lo, hi = blo, bhi
    t_lo = t_hi = None
    if settings.t_guard:
        half = float(stats.t.ppf(0.5 + conf_look / 2.0, d.size - 1)) * sd / math.sqrt(d.size)
        t_lo, t_hi = mean - half, mean + half
        lo, hi = min(blo, t_lo), max(bhi, t_hi)
        method = f"{method}+t"
    g = math.log1p(gain)
    verdict: Verdict
    if lo > g:
        verdict = "keep"
    elif hi < g:
        verdict = "revert"
    else:
        verdict = "inconclusive" if final else "continue"
    return Decision(
        verdict=verdict, n_pairs=int(d.size), mean_log=mean, sd_log=sd, ratio=math.exp(mean),
        ci_low=math.exp(lo), ci_high=math.exp(hi), confidence=settings.confidence,
        confidence_per_look=conf_look, n_looks=n_looks, final=final, method=method,
        bootstrap_seed=settings.bootstrap_seed, resamples=settings.bootstrap_resamples,
        min_gain=gain, boot_ci_low=math.exp(blo), boot_ci_high=math.exp(bhi),
        t_ci_low=math.exp(t_lo) if t_lo is not None else None,
        t_ci_high=math.exp(t_hi) if t_hi is not None else None,
    )


