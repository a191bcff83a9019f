"""The sequential paired decision (design ``sequential``): a group-sequential
test with error spending on a trimmed mean of the paired log-ratios, a pair
budget that follows the noise, and a futility stop. Pure functions of the
log-ratios and the parameters; no I/O, no randomness.

Statistic. At a look on ``n`` pairs ``d = log(B/A)``: the ``trim``-trimmed
mean (``k = floor(trim * n)`` values cut from each end), its Yuen standard
error ``se = sqrt((n - 1) * s_w^2 / (h * (h - 1)))`` (``s_w``: sd of the
winsorized values, ``h = n - 2k``) and ``df = h - 1``. The paired difference
of two runs with the same noise law is symmetric about the true effect, so the
trimmed mean estimates it while a stall or a heavy tail is cut away.

Budget. ``sigma = se * sqrt(n)`` (pooled with the A/A's sd when one is given,
weighted by degrees of freedom) gives the pairs a fixed-n one-sided test at
level ``alpha`` needs for ``power`` at ``target_gain``:
``N = ceil(1.1 * ((z_alpha + z_power) * sigma / (log(1+target) - g))^2)``,
clamped to ``[min_pairs, max_pairs]`` (``max_pairs`` when ``g`` reaches the target) (1.1 pays for the sequential looks and
the trimming). The look on ``n >= N`` pairs (or on ``max_pairs``) is final.

Keep (efficacy). Information fraction ``t_k = min(1, max(n_k / N_k,
t_{k-1} + (n_k - n_{k-1}) / max_pairs))`` (strictly increasing; 1 at the final
look). Alpha is spent as ``alpha * t^rho`` (default ``rho = 4``: O'Brien-Fleming-like,
little early, most at the end, where the power at small gains is decided). The z boundaries ``c_k`` are exact for
Brownian motion observed at information ``n_k`` (numerical integration of the
continuation density, :func:`keep_boundaries`), each converted to the t scale
at the look's ``df`` (same tail probability). Keep iff
``mean - c_k * se > g = log((1 + min_gain)(1 + floor))``: the lower end of the
look's interval ``mean +- c_k * se`` clears the minimum gain and the session
A/A's floor together (:func:`inferloom.measure.keep_rule.keep_threshold`;
``floor`` 0 without an A/A). ``g`` stands for the minimum gain everywhere
below (budget, futility, the below-the-minimum revert). Over all looks the probability of
a keep at a true effect of ``min_gain`` is at most ``alpha`` (as far as the
t conversion is exact; simulated in docs/protocol.md).

Futility (non-binding, so it never raises the false-keep rate). The gain
worth reaching is ``g_f = max(log(1 + target_gain), g + z * sigma *
sqrt(1.1 / N))``: the target, or, when the noise is too high for the target
within ``max_pairs``, the smallest gain the budget can resolve with ``power``.
Beta is spent evenly (``beta * t``); at look ``k`` the increment ``b_k`` is
tested on its own (union bound): revert iff ``mean + f_k * sigma / sqrt(n) <
g_f`` with ``f_k`` the t quantile of ``1 - b_k`` at ``df`` plus the A/A's
degrees of freedom (a futility stop never keeps, so it may lean on the A/A's
sd, pooled into ``sigma``): a gain worth keeping is out of reach.
Also revert iff the whole interval lies below the minimum gain. Otherwise
continue, or inconclusive at the final look.

Harm stop (:func:`harm_look`; it only reverts, so it never raises the false-keep rate). Before the first
look, after pair ``k`` (``HARM_MIN_PAIRS = 2 <= k < min_pairs``), revert iff every pair's log-ratio so far
is below ``L_k = min(log(harm_ratio), -z_k * s_k)``: ``s_k`` the per-pair sd, the larger of the session
A/A's (``prior_sd``; :data:`HARM_FALLBACK_SD` without an A/A) and the sd of the ``k`` pairs themselves;
``z_k = sqrt((1 - q_k) / q_k)`` with ``q_k = (HARM_ERROR * 2^-(k-1))^(1/k)``. By Cantelli's inequality
(``P(d - mu <= -z s) <= 1 / (1 + z^2)`` for any law with sd at most ``s``), at a true ratio of at least 1
(``mu >= 0``) with independent pairs, a harm stop at pair ``k`` has probability at most ``q_k^k = HARM_ERROR
* 2^-(k-1)``, and at any pair at most ``HARM_ERROR`` (0.1%) in all: whatever the tails, for any noise whose
per-pair sd the A/A (or the fallback) does not underestimate. Chosen and simulated in docs/protocol.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np
from scipy import optimize, special, stats

from inferloom.measure.keep_rule import keep_threshold

__all__ = ["BUDGET_INFLATION", "FUTILITY_SPENDING", "GRID", "HARM_ERROR", "HARM_MIN_PAIRS", "HARM_FALLBACK_SD",
           "trimmed_stats", "spent", "keep_boundaries", "budget", "SeqLook", "sequential_look", "HarmLook",
           "harm_error_at", "harm_z", "harm_look"]

#: factor on the fixed-n pair count for the sequential looks and the trimming
BUDGET_INFLATION = 1.1
#: futility error spent by information fraction t is ``beta * t^FUTILITY_SPENDING`` (evenly: stop early at no gain)
FUTILITY_SPENDING = 1.0
#: grid points of the continuation density (score scale) in :func:`keep_boundaries`
GRID = 401
#: the harm stop's error: at most this probability of a harm stop at a true ratio >= 1 (Cantelli's bound)
HARM_ERROR = 1e-3
#: a harm stop needs at least this many pairs (one in each order: a one-off slow first run never stops it)
HARM_MIN_PAIRS = 2
#: the per-pair sd the harm stop assumes without a session A/A (the largest measured on a 2x loaded machine: 0.41)
HARM_FALLBACK_SD = 0.5


def _pdf(z: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def trimmed_stats(d: np.ndarray, trim: float) -> tuple[float, float, int]:
    """``(trimmed mean, Yuen standard error, df)`` of ``d`` (see the module doc)."""
    n = d.size
    k = int(math.floor(trim * n))
    s = np.sort(d)
    h = n - 2 * k
    mean = float(s[k:n - k].mean())
    w = np.clip(s, s[k], s[n - k - 1])
    sw2 = float(w.var(ddof=1))
    se = math.sqrt(max(0.0, (n - 1) * sw2 / (h * (h - 1))))
    return mean, se, h - 1


def spent(t: float, total: float, rho: float) -> float:
    """Error spent by information fraction ``t``: ``total * t^rho`` (``t`` capped at 1)."""
    return total * min(1.0, max(0.0, t)) ** rho


@lru_cache(maxsize=4096)
def keep_boundaries(info: tuple[int, ...], cum_alpha: tuple[float, ...]) -> tuple[float, ...]:
    """One-sided z boundaries of a group-sequential test: ``c_k`` such that a
    standard Brownian motion ``S`` observed at information ``info[k]`` (the
    statistic ``Z_k = S_k / sqrt(info[k])``) first crosses ``c_k`` at look ``k``
    with probability ``cum_alpha[k] - cum_alpha[k-1]``. A look that spends
    nothing gets ``inf``."""
    out: list[float] = []
    s = w = f = None  # grid (score scale), trapezoid weights, continuation density
    prev_i, prev_a = 0.0, 0.0
    for i, a in zip((float(x) for x in info), cum_alpha):
        inc = a - prev_a
        sd_i = math.sqrt(i)
        if f is None:
            c = float(stats.norm.isf(inc)) if inc > 0 else math.inf
            hi = c * sd_i if math.isfinite(c) else 10.0 * sd_i
            s = np.linspace(-10.0 * sd_i, hi, GRID)
            f = _pdf(s / sd_i) / sd_i
        else:
            dsd = math.sqrt(i - prev_i)
            mass = f * w

            def cross(b: float) -> float:
                return float(np.sum(mass * special.ndtr((s - b) / dsd)))

            if inc <= 0:
                c, b = math.inf, 10.0 * sd_i + float(s[-1])
            else:
                lo_b, hi_b = float(s[0]), float(s[-1]) + 12.0 * dsd
                if cross(lo_b) <= inc:  # cannot happen for a proper spending increment; be safe
                    b = lo_b
                else:
                    b = float(optimize.brentq(lambda x: cross(x) - inc, lo_b, hi_b, xtol=1e-10))
                c = b / sd_i
            u = np.linspace(-10.0 * sd_i, min(b, float(s[-1]) + 10.0 * dsd), GRID)
            f = (_pdf((u[:, None] - s[None, :]) / dsd) / dsd) @ mass
            s = u
        w = np.full(s.size, 2.0)  # Simpson's rule (GRID is odd)
        w[1:-1:2] = 4.0
        w[0] = w[-1] = 1.0
        w *= (s[1] - s[0]) / 3.0
        out.append(c)
        prev_i, prev_a = i, a
    return tuple(out)


def budget(sigma: float, *, alpha: float, power: float, min_gain: float, target_gain: float,
           min_pairs: int, max_pairs: int) -> int:
    """Pairs for ``power`` at ``target_gain`` with per-pair sd ``sigma`` (see the module doc); ``min_gain``
    is the whole keep threshold (the A/A floor included). ``max_pairs`` when it reaches the target."""
    delta = math.log1p(target_gain) - math.log1p(min_gain)
    if delta <= 0.0:
        return max_pairs
    z = float(stats.norm.isf(alpha) + stats.norm.ppf(power))
    need = BUDGET_INFLATION * (z * sigma / delta) ** 2
    return int(min(max_pairs, max(min_pairs, math.ceil(need - 1e-9))))


@dataclass(frozen=True)
class SeqLook:
    """One look of the sequential design (log scale; ``c_t``/``f_t`` t-scale critical values)."""

    n_pairs: int
    mean: float
    se: float
    df: int
    sigma: float          # per-pair sd the budget used (pooled with the prior when given)
    budget: int
    t: float              # information fraction
    alpha_spent: float    # cumulative
    beta_spent: float
    c_z: float
    c_t: float
    f_t: float | None     # futility critical value (None: no beta at this look)
    lo: float
    hi: float
    fut_hi: float | None  # mean + f_t * se
    g_fut: float          # the gain worth reaching (log): futility reverts when fut_hi is below it
    final: bool
    verdict: str          # keep / revert / continue / inconclusive
    stop: str | None      # efficacy / futility / below_min_gain / budget
    reason: str


def sequential_look(d: Sequence[float], looks: Sequence[int], *, alpha: float, beta: float, power: float,
                    min_gain: float, target_gain: float, trim: float, rho: float, max_pairs: int,
                    prior_sd: float | None = None, prior_df: int = 0, until_decisive: bool = False,
                    fixed_budget: int | None = None, floor: float = 0.0) -> list[SeqLook]:
    """Every look on ``d`` at the pair counts ``looks`` (increasing, each ``<= len(d)``), up to and
    including the first final one (or the first decisive one with ``until_decisive``).
    ``fixed_budget``: a budget that does not follow the noise (an A/A runs every pair). ``floor``: the
    session A/A's floor, cleared on top of ``min_gain``. Pure."""
    x = np.asarray(d, dtype=float)
    thr = keep_threshold(min_gain, floor)
    g, g1 = math.log1p(min_gain) + math.log1p(floor), math.log1p(target_gain)  # log(thr)
    bar = f"+{100.0 * min_gain:.1f}%" + (f" and the A/A floor +{100.0 * floor:.2f}% (x{thr:.4f})" if floor else "")
    out: list[SeqLook] = []
    ns: list[int] = []
    cum: list[float] = []
    t_prev, n_prev, b_prev = 0.0, 0, 0.0
    for n in looks:
        mean, se, df = trimmed_stats(x[:n], trim)
        sig = se * math.sqrt(n)
        if prior_sd is not None and prior_df > 0:
            sig = math.sqrt((prior_df * prior_sd ** 2 + (n - 1) * sig ** 2) / (prior_df + n - 1))
        nb = fixed_budget or budget(sig, alpha=alpha, power=power, min_gain=thr - 1.0, target_gain=target_gain,
                                    min_pairs=looks[0], max_pairs=max_pairs)
        z = float(stats.norm.isf(alpha) + stats.norm.ppf(power))
        g_fut = max(g1, g + z * sig * math.sqrt(BUDGET_INFLATION / nb))  # the gain this budget can resolve
        final = n >= nb or n >= max_pairs
        t = 1.0 if final else min(1.0, max(n / nb, t_prev + (n - n_prev) / max_pairs))
        ns.append(n)
        cum.append(spent(t, alpha, rho))
        c_z = keep_boundaries(tuple(ns), tuple(cum))[-1]
        c_t = float(stats.t.isf(stats.norm.sf(c_z), df)) if math.isfinite(c_z) else math.inf
        b_cum = spent(t, beta, FUTILITY_SPENDING)
        # futility never keeps, so it may lean on the A/A: the pooled sd and its degrees of freedom
        df_f = df + (prior_df if prior_sd is not None and prior_df > 0 else 0)
        se_f = sig / math.sqrt(n)
        f_t = float(stats.t.isf(b_cum - b_prev, df_f)) if b_cum > b_prev else None
        lo, hi = (mean - c_t * se, mean + c_t * se) if se > 0 else (mean, mean)
        fut_hi = (mean + f_t * se_f if se_f > 0 else mean) if f_t is not None else None
        if lo > g:
            verdict, stop = "keep", "efficacy"
            reason = f"keep: the interval's lower end x{math.exp(lo):.4f} clears the minimum gain {bar} after {n} pairs"
        elif hi < g:
            verdict, stop = "revert", "below_min_gain"
            reason = f"revert: the whole interval lies below the minimum gain {bar} after {n} pairs"
        elif fut_hi is not None and fut_hi < g_fut:
            verdict, stop = "revert", "futility"
            reason = (f"revert (futility): a gain of +{100 * math.expm1(g_fut):.1f}% is out of reach after {n} pairs "
                      f"(upper end x{math.exp(fut_hi):.4f} at the futility level)")
        elif final:
            verdict, stop = "inconclusive", "budget"
            reason = (f"inconclusive: the pair budget ({n} of {nb} needed at this noise, max {max_pairs}) is spent "
                      f"with neither a keep nor a futility stop")
        else:
            verdict, stop, reason = "continue", None, f"continue: {n} of a {nb}-pair budget"
        out.append(SeqLook(n_pairs=n, mean=mean, se=se, df=df, sigma=sig, budget=nb, t=t, alpha_spent=cum[-1],
                           beta_spent=b_cum, c_z=c_z, c_t=c_t, f_t=f_t, lo=lo, hi=hi, fut_hi=fut_hi, g_fut=g_fut, final=final,
                           verdict=verdict, stop=stop, reason=reason))
        if final or (until_decisive and verdict != "continue"):
            break
        t_prev, n_prev, b_prev = t, n, b_cum
    return out


@dataclass(frozen=True)
class HarmLook:
    """The harm check after ``n_pairs`` pairs (log scale): ``sd`` the per-pair sd it used (``sd_from``:
    ``aa``, ``fallback`` or ``pairs``: whichever was the largest), ``z`` its Cantelli multiplier,
    ``bound`` the log-ratio every pair must be below, ``worst`` the largest pair log-ratio, ``stop``
    whether it reverts, and ``reason`` in words."""

    n_pairs: int
    harm_ratio: float
    error: float          # this pair count's share of HARM_ERROR
    sd: float
    sd_from: str
    z: float
    bound: float
    worst: float
    mean: float
    stop: bool
    reason: str


def harm_error_at(k: int) -> float:
    """Pair ``k``'s share of :data:`HARM_ERROR`: ``HARM_ERROR * 2^-(k - HARM_MIN_PAIRS + 1)`` (sums to it)."""
    return HARM_ERROR * 0.5 ** (k - HARM_MIN_PAIRS + 1)


def harm_z(k: int) -> float:
    """Cantelli's multiplier for ``k`` pairs all below ``-z s``: ``q = error^(1/k)``, ``z = sqrt((1 - q) / q)``."""
    q = harm_error_at(k) ** (1.0 / k)
    return math.sqrt((1.0 - q) / q)


def harm_look(d: Sequence[float], *, harm_ratio: float, prior_sd: float | None = None) -> HarmLook | None:
    """The harm check on all of ``d`` (module doc): None when it is off (``harm_ratio`` 0) or ``d`` has fewer
    than :data:`HARM_MIN_PAIRS` pairs. The caller asks it only before the first look. Pure."""
    x = np.asarray(d, dtype=float)
    k = int(x.size)
    if not harm_ratio or harm_ratio <= 0.0 or k < HARM_MIN_PAIRS:
        return None
    cands = [("aa", float(prior_sd)) if prior_sd is not None else ("fallback", HARM_FALLBACK_SD),
             ("pairs", float(x.std(ddof=1)))]
    sd_from, sd = max(cands, key=lambda c: c[1])
    z = harm_z(k)
    bound = min(math.log(harm_ratio), -z * sd)
    worst, mean = float(x.max()), float(x.mean())
    stop = worst < bound
    src = {"aa": "the A/A's", "fallback": "no A/A: the fallback", "pairs": "the pairs'"}[sd_from]
    if stop:
        reason = (f"revert (harm): grossly slower: all {k} pairs are below x{math.exp(bound):.4f} (the lower of the "
                  f"harm ratio x{harm_ratio:g} and {z:.2f} sd below 1, sd {sd:.4f} {src}); ratio x{math.exp(mean):.4f} "
                  f"after {k} pairs, before the first look")
    else:
        reason = f"continue: not every pair is below the harm bound x{math.exp(bound):.4f} after {k} pairs"
    return HarmLook(n_pairs=k, harm_ratio=float(harm_ratio), error=harm_error_at(k), sd=sd, sd_from=sd_from, z=z,
                    bound=bound, worst=worst, mean=mean, stop=stop, reason=reason)
