"""An additive surrogate for the default orchestrator's search (issue 15):
Bayesian linear regression of every measured trial's log-gain over stock on
one-hot knob values (main effects only; stock's value of each knob is the
baseline), and the next change-set relative to the stack chosen by an upper
confidence bound: predicted log-gain + ``beta`` x its posterior sd. A value
never measured has the prior's mean 0 and the widest interval, so it is
explored; one measured good in any configuration is believed good in others
(main effects carry over; interactions are what the model leaves out, and
what the stalled-stack widening in ``search_moves.py`` is for).

Deterministic (no randomness; ties go to knob order, then value order); numpy
only. Trials that failed or were refused are left out (infeasible, not slow:
``search_refusals.py`` keeps the orchestrator off them)."""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from inferloom.agents.search_view import _domain, _View

__all__ = ["ucb_proposal", "PRIOR_SD", "NOISE_SD", "BETA"]

PRIOR_SD = 0.1  # a main effect of one knob value: about +-10% (a guess, the size of the priors' own claims)
NOISE_SD = 0.05  # one trial's log-ratio noise plus what the additive model leaves out (a guess)
# the UCB's weight on the posterior sd: 2.0 chosen among 0.5 / 1 / 1.5 / 2 / 3 on the landscapes of seeds 0-9 of
# benchmarks/search_efficiency.py (docs/benchmarks.md section 10, which reports fresh seeds too)
BETA = 2.0


def ucb_proposal(view: _View, history: Iterable[tuple[Mapping[str, Any], float]], width: int,
                 ok: Callable[[Mapping[str, Any]], Mapping[str, Any] | None], beta: float = BETA,
                 demote: Callable[[Mapping[str, Any]], bool] = lambda cfg: False,
                 prior_mean: Mapping[tuple[str, Any], float] | None = None, pair_sd: float = 0.0,
                 known_pairs: bool = False, chosen_sd: bool = False, anchor: bool = False) -> tuple[dict[str, Any], float] | None:
    """The change-set of at most ``width`` knobs (before ``ok``'s completion) with the
    highest upper confidence bound, with its predicted log-gain over the stack;
    ``ok(changes)`` returns the change-set to measure (possibly completed) or None
    to skip it; ``demote(config)``: rank that candidate after every other one (a
    refusal learned in the session makes it suspect); ``prior_mean``: (knob, value) -> the prior mean of
    its coefficient (default 0; the expert priors' claims, ``search_priors.py``); ``pair_sd`` > 0: pairwise
    interaction terms too (:class:`_PairModel`). None when no candidate is left."""
    domains = {k.name: [v for v in _domain(k, view.stack[k.name])[0]] for k in view.space}
    cols = {(n, v): i for i, (n, v) in enumerate((n, v) for n, vs in domains.items() for v in vs
                                                  if v != view.stock[n])}

    def row(cfg: Mapping[str, Any]) -> np.ndarray:
        x = np.zeros(len(cols))
        for n in domains:
            i = cols.get((n, cfg[n]))
            if i is not None:
                x[i] = 1.0
        return x

    data = [(row(p), y) for p, y in history]
    X = np.array([x for x, _ in data]).reshape(len(data), len(cols))
    y = np.array([v for _, v in data])
    A = X.T @ X / NOISE_SD**2 + np.eye(len(cols)) / PRIOR_SD**2
    cov = np.linalg.inv(A)
    m0 = np.zeros(len(cols))
    for col, m in (prior_mean or {}).items():
        if col in cols:
            m0[cols[col]] = m
    mean = cov @ (X.T @ y / NOISE_SD**2 + m0 / PRIOR_SD**2)
    stack = row(view.stack)
    pairs = _PairModel(domains, view.stock, [p for p, _ in history], y - X @ m0, pair_sd) if pair_sd > 0 else None
    best: tuple[tuple[bool, float], dict[str, Any], float] | None = None

    def consider(raw: Mapping[str, Any]) -> None:
        nonlocal best
        changes = ok(raw)
        if changes is None:
            return
        cfg = {**view.stack, **changes}
        dx = row(cfg) - stack
        asked = {**view.stack, **raw} if chosen_sd else cfg  # chosen_sd: the completion's knobs earn no exploration
        da = row(asked) - stack
        if pairs is None:
            mu, sd = float(dx @ mean), float(np.sqrt(max(da @ cov @ da, 0.0)))
        else:
            mu, var = pairs.delta(cfg, view.stack)[0], pairs.delta(asked, view.stack)[1]
            mu, sd = mu + float(dx @ m0), float(np.sqrt(max(var, 0.0)))
        score = (not demote(cfg), mu + beta * sd)
        if best is None or score[0] > best[0][0] or (score[0] == best[0][0] and score[1] > best[0][1] + 1e-12):
            best = (score, dict(changes), mu)

    measured = {(n, p[n]) for p, _ in history for n in domains}
    for raw in _candidates(domains, view.stack, width):
        if known_pairs and len(raw) > 1 and not all(c in measured for c in raw.items()):
            continue  # two knobs move together for an interaction of known values, not to explore two unknowns
        consider(raw)
    if anchor and history:  # also from the measured configuration the model believes best, when above the stack
        top = max((p for p, _ in history), key=lambda p: float(row(p) @ mean))
        if float((row(top) - stack) @ mean) > 1e-9:
            lead = {n: top[n] for n in domains if top[n] != view.stack[n]}
            for raw in _candidates(domains, {**view.stack, **lead}, width):
                out = {n: v for n, v in {**lead, **raw}.items() if v != view.stack[n]}
                if out:
                    consider(out)
    return None if best is None else (best[1], best[2])


def _candidates(domains: Mapping[str, list[Any]], stack: Mapping[str, Any], width: int) -> Iterable[dict[str, Any]]:
    """Every change-set of 1 to ``width`` knobs, in knob order, then value order."""
    for r in range(1, width + 1):
        for names in itertools.combinations(list(domains), r):
            for vals in itertools.product(*[[v for v in domains[n] if v != stack[n]] for n in names]):
                yield dict(zip(names, vals))



class _PairModel:
    """The additive model plus a coefficient (prior sd ``pair_sd``) for every pair of non-stock values of two
    knobs, in its kernel form (a Gaussian process over configurations): the prior covariance of two
    configurations is PRIOR_SD^2 m + pair_sd^2 m(m-1)/2, m the number of knobs where both hold the same
    non-stock value (with ``pair_sd`` 0 this is the additive model exactly). A pair no trial held together
    keeps its prior sd: a value measured at one stack is no longer taken for certain at another, by up to
    ``pair_sd`` per knob the stack changed. Cost: one n x n solve, n the measured trials."""

    def __init__(self, domains: Mapping[str, list[Any]], stock: Mapping[str, Any],
                 configs: list[Mapping[str, Any]], resid: np.ndarray, pair_sd: float) -> None:
        self.index = {n: {v: i for i, v in enumerate(vs)} for n, vs in domains.items()}
        self.base = self.codes(stock)
        self.X = np.array([self.codes(c) for c in configs]).reshape(len(configs), len(self.index))
        self.s2 = pair_sd ** 2
        K = self.k(self.X[:, None, :], self.X[None, :, :]) + NOISE_SD ** 2 * np.eye(len(configs))
        self.Kinv = np.linalg.inv(K)
        self.alpha = self.Kinv @ resid

    def codes(self, cfg: Mapping[str, Any]) -> np.ndarray:
        return np.array([self.index[n].get(cfg[n], -1) for n in self.index])

    def k(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        m = ((a == b) & (a != self.base)).sum(axis=-1).astype(float)
        return PRIOR_SD ** 2 * m + self.s2 * m * (m - 1) / 2

    def delta(self, cfg: Mapping[str, Any], stack: Mapping[str, Any]) -> tuple[float, float]:
        """Posterior mean and variance of log-gain(cfg) - log-gain(stack), prior means left out."""
        c, s = self.codes(cfg), self.codes(stack)
        d = self.k(c[None, :], self.X) - self.k(s[None, :], self.X)
        prior = float(self.k(c, c) + self.k(s, s) - 2 * self.k(c, s))
        return float(d @ self.alpha), prior - float(d @ self.Kinv @ d)
