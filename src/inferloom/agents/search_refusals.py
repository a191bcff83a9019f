"""Refusals learned as the session goes (issue 15): for an engine that hands no
cross-knob rules (``CrossKnobRules``; e.g. the vLLM adapter), a configuration
the engine refused or that failed to run is a measured fact about
feasibility, not a bad gain. Pure functions of the state view.

* :func:`refused_combinations`: for each trial with verdict ``failed`` or
  ``refused``, the (knob=value) combination taken as the cause: the values it
  changed relative to the stack it was measured against, plus the values of
  the other knobs its error message names (the trial's ``error``, else its
  ``lesson``, where the rule critic quotes the error's first line; e.g.
  "static_loop decodes over a static KV cache; cache_implementation is
  dynamic" names ``cache_implementation``, so ``decode_loop=static_loop`` is
  refused only while the cache stays dynamic).
* :func:`contains_refused`: whether a full configuration contains one of them
  (the orchestrator never proposes such a configuration; its search model
  leaves refused trials out of the regression instead of scoring them).
* :func:`suspect`: the same combinations generalised over the changed knobs'
  values: a configuration that moves a changed knob off the value it had in
  the refused trial's stack, with the named knobs' values as they were, is
  suspect (e.g. ``prompt_lookup=2`` after ``prompt_lookup=1`` was refused at
  ``micro_batch=4``). Not banned: the search model ranks suspect candidates
  after every other one (one value of a knob may be refused where another is
  not: ``sdpa_backend=efficient`` is CUDA-only, ``math`` is not).

A message naming no other knob makes the changed values alone the
combination: refused with any other knob values, until the session ends."""

from __future__ import annotations

import re
from typing import Any, Mapping, Protocol, Sequence

__all__ = ["REFUSED_VERDICTS", "TrialHistory", "refused_combinations", "contains_refused", "suspect"]

REFUSED_VERDICTS = frozenset({"failed", "refused"})


class TrialHistory(Protocol):
    """What the refusal rules read of the orchestrator's view of the state: the
    view ``search_view.py`` builds is one (it asks :func:`refused_combinations`
    while it is built, so it imports this module, and this module knows it only
    by this type)."""

    @property
    def stock(self) -> Mapping[str, Any]:
        """Stock's full configuration."""
        ...

    @property
    def by_name(self) -> Mapping[str, Any]:
        """The knobs by name, in the configuration's order."""
        ...

    @property
    def replayed(self) -> Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]:
        """(trial, its full configuration), in trial order."""
        ...


def _named(text: str, names: list[str]) -> set[str]:
    """Knob names ``text`` mentions as whole words (``dtype`` is not in ``kv_cache_dtype``)."""
    return {n for n in names if re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", text)}


Pattern = tuple[dict[str, Any], dict[str, Any]]  # (changed knob -> its feasible stack value, named knob -> value)


def refused_combinations(view: TrialHistory) -> tuple[list[dict[str, Any]], list[Pattern]]:
    """The refused (knob=value) combinations of the trials measured so far, in trial order,
    deduplicated, and their generalisations for :func:`suspect`."""
    out: list[dict[str, Any]] = []
    patterns: list[Pattern] = []
    stack = view.stock
    names = list(view.by_name)
    for t, cfg in view.replayed:
        if t.get("verdict") in REFUSED_VERDICTS:
            changed = {n for n in names if cfg[n] != stack[n]}
            if changed:  # a refused stack itself (nothing changed) says nothing about a change
                text = " ".join(str(t.get(k) or "") for k in ("error", "lesson"))
                named = _named(text, names)
                combo = {n: cfg[n] for n in names if n in changed | named}
                pattern = ({n: stack[n] for n in names if n in changed},
                           {n: cfg[n] for n in names if n in named - changed})
                if combo not in out:
                    out.append(combo)
                if pattern not in patterns:
                    patterns.append(pattern)
        elif t.get("verdict") == "keep":
            stack = cfg
    return out, patterns


def suspect(cfg: Mapping[str, Any], patterns: list[Pattern]) -> bool:
    """True when ``cfg`` moves every changed knob of some refusal off its feasible value, the knobs
    its message named being as they were."""
    return any(all(n in cfg and cfg[n] != v for n, v in moved.items())
               and all(n in cfg and cfg[n] == v for n, v in fixed.items()) for moved, fixed in patterns)


def contains_refused(cfg: Mapping[str, Any], refused: list[dict[str, Any]]) -> bool:
    """True when the full configuration ``cfg`` holds every value of some refused combination."""
    return any(all(n in cfg and cfg[n] == v for n, v in combo.items()) for combo in refused)
