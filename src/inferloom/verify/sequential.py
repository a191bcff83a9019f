"""The sequential design's statistics, written again from its published contract (docs/protocol.md, the
module docstring of ``inferloom.measure.sequential``), not imported from it: per look the trimmed mean of
the paired log-ratios with Yuen's standard error, the pair budget, the information fraction, the spent
errors, the keep threshold (minimum gain and A/A floor), the keep boundary (a group-sequential boundary for Brownian motion, here by Simpson's rule on the
z scale: another quadrature than the protocol's), the futility bound and the verdict; and the harm stop
before the first look (:func:`recompute_harm`: every pair below ``min(log harm_ratio, -z_k s_k)``, Cantelli's
multiplier at pair ``k``'s share of the 0.1% harm error).

A boundary recomputed by another quadrature agrees to about 1e-6; the check allows :data:`Z_TOL` on the z
scale and carries it into the interval's ends."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import optimize, stats

__all__ = ["Z_TOL", "SeqRecomputed", "trimmed", "boundaries", "keep_log_threshold", "recompute_looks", "HarmRecomputed",
           "recompute_harm"]

#: tolerance on a recomputed z boundary
Z_TOL = 1e-4
_POINTS = 1201
_BUDGET_INFLATION = 1.1
_FUTILITY_SPENDING = 1.0
_HARM_ERROR, _HARM_FIRST, _HARM_NO_AA_SD = 1e-3, 2, 0.5  # docs/protocol.md, "Harm stop"


def keep_log_threshold(st: Mapping[str, Any]) -> float:
    """The log ratio a keep's lower end must exceed under settings ``st``: ``log(1 + min_gain) + log(1 + floor)``,
    the session A/A's ``floor`` cleared on top of the minimum gain (absent in results written before it: 0)."""
    return math.log(1.0 + float(st["min_gain"])) + math.log(1.0 + float(st.get("floor") or 0.0))


def trimmed(d: Sequence[float], trim: float) -> tuple[float, float, int]:
    """``(trimmed mean, Yuen se, df)``: ``k = floor(trim n)`` cut from each end, the winsorized variance."""
    x = sorted(float(v) for v in d)
    n = len(x)
    k = int(math.floor(trim * n))
    h = n - 2 * k
    mean = math.fsum(x[k:n - k]) / h
    w = [min(max(v, x[k]), x[n - k - 1]) for v in x]
    wm = math.fsum(w) / n
    sw2 = math.fsum((v - wm) ** 2 for v in w) / (n - 1)
    return mean, math.sqrt(max(0.0, (n - 1) * sw2 / (h * (h - 1)))), h - 1


def _simpson(z: np.ndarray) -> np.ndarray:
    m = z.size  # odd
    wts = np.ones(m)
    wts[1:-1:2], wts[2:-1:2] = 4.0, 2.0
    return wts * (z[1] - z[0]) / 3.0


def boundaries(info: Sequence[int], cum: Sequence[float]) -> list[float]:
    """z boundaries ``c_k``: P(first ``Z_j >= c_j`` at look k) = ``cum[k] - cum[k-1]``, with ``Z_j`` the
    standardized sums at information ``info[j]`` (corr ``sqrt(info_i / info_j)``); ``inf`` where nothing is spent."""
    out: list[float] = []
    z = dens = None
    for k, (i, a) in enumerate(zip(info, cum)):
        inc = a - (cum[k - 1] if k else 0.0)
        if dens is None:
            c = float(stats.norm.isf(inc)) if inc > 0 else math.inf
            z = np.linspace(-10.0, min(c, 10.0), _POINTS)
            dens = stats.norm.pdf(z)
        else:
            r = math.sqrt(info[k - 1] / i)  # Z_k = r Z_{k-1} + sqrt(1 - r^2) e
            q = math.sqrt(1.0 - r * r)
            mass = dens * _simpson(z)

            def cross(c: float) -> float:
                return float(np.sum(mass * stats.norm.sf((c - r * z) / q)))

            if inc <= 0:
                c = math.inf
            else:
                c = float(optimize.brentq(lambda x: cross(x) - inc, -10.0, 40.0, xtol=1e-12))
            u = np.linspace(-10.0, min(c, 10.0 + r * float(z[-1])), _POINTS)
            dens = (stats.norm.pdf((u[:, None] - r * z[None, :]) / q) / q) @ mass
            z = u
        out.append(c)
    return out


@dataclass(frozen=True)
class SeqRecomputed:
    """One look recomputed (log scale)."""

    n_pairs: int
    mean: float
    se: float
    df: int
    sigma: float
    budget: int
    t: float
    alpha_spent: float
    beta_spent: float
    c_z: float
    c_t: float
    f_t: float | None
    lo: float
    hi: float
    fut_hi: float | None
    g_fut: float
    final: bool
    verdict: str


def recompute_looks(d: Sequence[float], st: Mapping[str, Any], looks: Sequence[int], *,
                    every_pair: bool) -> list[SeqRecomputed]:
    """The looks at pair counts ``looks`` on log-ratios ``d`` under settings ``st`` (the result's own)."""
    alpha = (1.0 - float(st["confidence"])) / 2.0
    beta, power, trim = float(st["futility_error"]), float(st["power"]), float(st["trim"])
    rho, max_pairs = float(st["spending_power"]), int(st["max_pairs"])
    g, g1 = keep_log_threshold(st), math.log(1.0 + float(st["target_gain"]))
    zsum = float(stats.norm.ppf(1.0 - alpha) + stats.norm.ppf(power))
    prior_sd, prior_df = st.get("prior_sd"), int(st.get("prior_df") or 0)
    out: list[SeqRecomputed] = []
    info: list[int] = []
    cum: list[float] = []
    t_prev, n_prev, b_prev = 0.0, 0, 0.0
    for n in looks:
        mean, se, df = trimmed(d[:n], trim)
        sig = se * math.sqrt(n)
        if prior_sd is not None and prior_df > 0:
            sig = math.sqrt((prior_df * float(prior_sd) ** 2 + (n - 1) * sig ** 2) / (prior_df + n - 1))
        need = _BUDGET_INFLATION * (zsum * sig / (g1 - g)) ** 2 if g1 > g else math.inf  # floor past the target: all
        nb = max_pairs if every_pair or need > max_pairs else int(max(looks[0], math.ceil(need - 1e-9)))
        g_fut = max(g1, g + zsum * sig * math.sqrt(_BUDGET_INFLATION / nb))
        final = n >= nb or n >= max_pairs
        t = 1.0 if final else min(1.0, max(n / nb, t_prev + (n - n_prev) / max_pairs))
        info.append(n)
        cum.append(alpha * min(1.0, t) ** rho)
        c_z = boundaries(info, cum)[-1]
        c_t = float(stats.t.ppf(stats.norm.cdf(c_z), df)) if math.isfinite(c_z) else math.inf
        b_cum = beta * min(1.0, t) ** _FUTILITY_SPENDING
        df_f = df + (prior_df if prior_sd is not None and prior_df > 0 else 0)  # futility pools the A/A's sd
        f_t = float(stats.t.ppf(1.0 - (b_cum - b_prev), df_f)) if b_cum > b_prev else None
        lo, hi = (mean - c_t * se, mean + c_t * se) if se > 0 else (mean, mean)
        se_f = sig / math.sqrt(n)
        fut_hi = None if f_t is None else (mean + f_t * se_f if se_f > 0 else mean)
        if lo > g:
            verdict = "keep"
        elif hi < g or (fut_hi is not None and fut_hi < g_fut):
            verdict = "revert"
        else:
            verdict = "inconclusive" if final else "continue"
        out.append(SeqRecomputed(n, mean, se, df, sig, nb, t, cum[-1], b_cum, c_z, c_t, f_t, lo, hi, fut_hi, g_fut,
                                 final, verdict))
        if final or (not every_pair and verdict != "continue"):
            break
        t_prev, n_prev, b_prev = t, n, b_cum
    return out


@dataclass(frozen=True)
class HarmRecomputed:
    """The harm stop recomputed at pair ``n_pairs`` (log scale)."""

    n_pairs: int
    sd: float
    bound: float
    mean: float
    sd_log: float


def recompute_harm(d: Sequence[float], st: Mapping[str, Any]) -> HarmRecomputed | None:
    """The first pair count ``k`` (``2 <= k < min_pairs``, ``k <= len(d)``) at which the harm stop reverts under
    settings ``st`` (the result's own; no ``harm_ratio``, a result written before it, or 0: never), else None.
    Pair ``k`` spends ``0.1% / 2^(k-1)`` of the harm error; with ``q = that^(1/k)`` every one of the ``k`` pairs must
    lie ``sqrt(1/q - 1)`` sds below 0 (Cantelli) and below ``log(harm_ratio)``; the sd is the larger of the A/A's
    (0.5 without one) and the ``k`` pairs' own."""
    h = float(st.get("harm_ratio") or 0.0)
    if h <= 0.0 or st.get("design", "bonferroni") != "sequential":
        return None
    prior = st.get("prior_sd")
    for k in range(_HARM_FIRST, min(len(d), int(st["min_pairs"]) - 1) + 1):
        x = [float(v) for v in d[:k]]
        m = math.fsum(x) / k
        own = math.sqrt(math.fsum((v - m) ** 2 for v in x) / (k - 1))
        sd = max(float(prior) if prior is not None else _HARM_NO_AA_SD, own)
        q = (_HARM_ERROR / 2.0 ** (k - 1)) ** (1.0 / k)
        bound = min(math.log(h), -math.sqrt(1.0 / q - 1.0) * sd)
        if max(x) < bound:
            return HarmRecomputed(k, sd, bound, m, own)
    return None
