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

from inferloom.agents.search_view import _domain, SearchView

__all__ = ["ucb_proposal", "PRIOR_SD", "NOISE_SD", "BETA"]

PRIOR_SD = 0.1  # a main effect of one knob value: about +-10% (a guess, the size of the priors' own claims)
NOISE_SD = 0.05  # one trial's log-ratio noise plus what the additive model leaves out (a guess)
# the UCB's weight on the posterior sd: 2.0 chosen among 0.5 / 1 / 1.5 / 2 / 3 on the landscapes of seeds 0-9 of
# benchmarks/search_efficiency.py (docs/benchmarks.md section 10, which reports fresh seeds too)
BETA = 2.0


def ucb_proposal(view: SearchView, history: Iterable[tuple[Mapping[str, Any], float]], width: int,
                 ok: Callable[[Mapping[str, Any]], Mapping[str, Any] | None], beta: float = BETA,
                 demote: Callable[[Mapping[str, Any]], bool] = lambda cfg: False,
                 prior_mean: Mapping[tuple[str, Any], float] | None = None,
                 ) -> tuple[dict[str, Any], float] | None:
    """The change-set of at most ``width`` knobs (before ``ok``'s completion) with the
    highest upper confidence bound, with its predicted log-gain over the stack;
    ``ok(changes)`` returns the change-set to measure (possibly completed) or None
    to skip it; ``demote(config)``: rank that candidate after every other one (a
    refusal learned in the session makes it suspect); ``prior_mean``: (knob, value) -> the prior mean of
    its coefficient (default 0; the expert priors' claims, ``search_priors.py``). None when no candidate is left."""
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
    best: tuple[tuple[bool, float], dict[str, Any], float] | None = None

    def consider(raw: Mapping[str, Any]) -> None:
        nonlocal best
        changes = ok(raw)
        if changes is None:
            return
        cfg = {**view.stack, **changes}
        dx = row(cfg) - stack
        mu, sd = float(dx @ mean), float(np.sqrt(max(dx @ cov @ dx, 0.0)))
        score = (not demote(cfg), mu + beta * sd)
        if best is None or score[0] > best[0][0] or (score[0] == best[0][0] and score[1] > best[0][1] + 1e-12):
            best = (score, dict(changes), mu)

    for raw in _candidates(domains, view.stack, width):
        consider(raw)
    return None if best is None else (best[1], best[2])


def _candidates(domains: Mapping[str, list[Any]], stack: Mapping[str, Any], width: int) -> Iterable[dict[str, Any]]:
    """Every change-set of 1 to ``width`` knobs, in knob order, then value order."""
    for r in range(1, width + 1):
        for names in itertools.combinations(list(domains), r):
            for vals in itertools.product(*[[v for v in domains[n] if v != stack[n]] for n in names]):
                yield dict(zip(names, vals))

