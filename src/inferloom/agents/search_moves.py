"""Proposing rules of the default orchestrator beyond "priors, then one knob
at a time" (issue 15; measured in docs/benchmarks.md, search efficiency).
Pure functions of the state view: deterministic, nothing kept between calls.

* :func:`since_keep`: trials of the current stack measured since the last
  keep (the stack's age). When the last ``prior_patience`` of them brought no
  keep, the priors have stopped helping for now: the orchestrator alternates
  search and priors instead of spending every slot on priors.
* :func:`width`: how many knobs a search proposal may change. One (attributable)
  until the stack is ``stall`` trials old without a keep; then two, so that
  a pair of interacting knobs can move together.
* :func:`repair`: a change-set the engine's cross-knob rules refuse, completed
  with the fewest extra knob changes (at most ``extra``) that make it
  feasible and unmeasured (e.g. ``prompt_lookup=3`` also moves
  ``micro_batch`` to 1): values the rules need are otherwise unreachable one
  knob at a time. Extra knobs are tried in knob order, their stock value
  first, then the domain order.
* :func:`spent`: whether a prior's change-set was already measured as a
  change (``RuleOrchestrator(prior_tries=N)``: N such trials and the prior
  gets no more slots; the default with the cross-knob rules is 1)."""

from __future__ import annotations

import itertools
from typing import Any, Callable, Mapping

from inferloom.agents.search_view import _domain, SearchView

__all__ = ["since_keep", "alternate_to_search", "width", "repair", "spent"]


def since_keep(view: SearchView) -> int:
    """Trials measured since the last keep (all of them when none was kept)."""
    n = 0
    for t, _ in reversed(view.replayed):
        if t.get("verdict") == "keep":
            break
        n += 1
    return n


def alternate_to_search(view: SearchView, prior_patience: int | None) -> bool:
    """True when this slot goes to the search although a prior is left: the
    last ``prior_patience`` trials brought no keep, and the slots since then
    alternate, search first."""
    if prior_patience is None:
        return False
    n = since_keep(view)
    return n >= prior_patience and (n - prior_patience) % 2 == 0


def width(view: SearchView, max_changes: int | None, stall: int | None) -> int | None:
    """Knobs a search proposal may change: ``max_changes``, widened to 2 once the
    stack is ``stall`` trials old without a keep."""
    if stall is not None and max_changes == 1 and since_keep(view) >= stall:
        return 2
    return max_changes


def repair(view: SearchView, changes: Mapping[str, Any], feasible: Callable[[Mapping[str, Any]], bool],
           extra: int = 2) -> dict[str, Any] | None:
    """``changes`` if feasible, else ``changes`` plus the fewest extra knob changes
    (at most ``extra``) that make it feasible and unmeasured; None when none does."""
    cfg, key = view.candidate(changes)
    if feasible(cfg):
        return dict(changes)
    others = [k for k in view.space if k.name not in changes]
    values = {}
    for k in others:
        dom = [v for v in _domain(k, view.stack[k.name])[0] if v != view.stack[k.name]]
        stock = view.stock[k.name]
        values[k.name] = ([stock] if stock in dom else []) + [v for v in dom if v != stock]
    for r in range(1, extra + 1):
        for names in itertools.combinations([k.name for k in others], r):
            for vals in itertools.product(*(values[n] for n in names)):
                out = {**changes, **dict(zip(names, vals))}
                cfg, key = view.candidate(out)
                if key not in view.seen and feasible(cfg):
                    return out
    return None


def spent(view: SearchView, full: Mapping[str, Any], tries: int = 1) -> bool:
    """True when ``tries`` trials already measured the values of ``full`` (a prior's change-set) as a
    change: configurations holding all of them, that changed at least one relative to their stack, and
    did not fail or get refused (a failure says nothing of the gain: the prior may run at another stack)."""
    stack, n = view.stock, 0
    for t, cfg in view.replayed:
        if (t.get("verdict") not in ("failed", "refused") and all(cfg.get(k) == v for k, v in full.items())
                and any(stack.get(k) != v for k, v in full.items())):
            n += 1
        stack = cfg if t.get("verdict") == "keep" else stack
    return n >= tries
