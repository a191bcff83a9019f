"""Expert priors folded into the default orchestrator's model instead of
given trial slots (issue 15; ``RuleOrchestrator(priors="model")``; measured in
docs/benchmarks.md section 10).

A prior's claimed gain becomes the prior mean of its knob values' coefficients
in the additive model (``search_model.py``), with the model's own prior sd: a
value a prior claims +30% for starts at log(1.3) instead of 0, so the upper
confidence bound tries it first while its claim is high, and the measured
trials pull it back once they contradict it (the claim is one observation's
worth of belief, not a rule). A single-knob prior claims its value outright;
a prior of several knobs claims what is left of its gain after the values
already claimed, split evenly over its unclaimed values (never below 0: a
prior only claims gains). Priors are taken in rank order; a prior whose
change-set failed before (``kb_failures``) claims nothing.

:func:`claimed_by` names the priors behind a proposal: a change-set holding a
claimed value no trial has measured yet was proposed because of that prior,
and the ledger says so (``source: "prior"``)."""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from inferloom.agents.priors import Prior

__all__ = ["prior_means", "claimed_by"]

Claims = dict[tuple[str, Any], tuple[float, Prior]]


def prior_means(resolved: Iterable[tuple[Prior, Mapping[str, Any]]], stock: Mapping[str, Any]) -> Claims:
    """(knob, value) -> (the prior mean of its log-gain coefficient, the prior claiming it), from
    ``(prior, its full change-set)`` pairs in rank order; values equal to stock's carry no coefficient."""
    items = [(p, {k: v for k, v in full.items() if v != stock.get(k)}) for p, full in resolved]
    claims: Claims = {}
    for p, cols in items:  # single-knob priors claim their value outright (the first one, by rank)
        if len(cols) == 1:
            (col,) = cols.items()
            if col not in claims:
                claims[col] = (max(0.0, math.log1p(max(p.predicted_gain, -0.99))), p)
    for p, cols in items:  # then each wider prior claims the rest of its gain over its unclaimed values
        if len(cols) > 1:
            free = [c for c in cols.items() if c not in claims]
            rest = math.log1p(max(p.predicted_gain, -0.99)) - sum(claims[c][0] for c in cols.items() if c in claims)
            for col in free:
                claims[col] = (max(0.0, rest / len(free)), p)
    return {c: m for c, m in claims.items() if m[0] > 0.0}


def claimed_by(changes: Mapping[str, Any], claims: Claims, measured: Iterable[Mapping[str, Any]]) -> list[Prior]:
    """The priors (rank order, no repeats) claiming a value of ``changes`` that none of the ``measured``
    configurations holds: what the model knows of that value is the prior's claim alone."""
    seen = {(k, v) for cfg in measured for k, v in cfg.items()}
    out: list[Prior] = []
    for col in changes.items():
        if col in claims and col not in seen and claims[col][1] not in out:
            out.append(claims[col][1])
    return sorted(out, key=lambda p: p.rank)
