"""What the default orchestrator reads from one state dict, parsed once
(:class:`SearchView`), and the knob-domain helpers its search uses. Split from
``rules.py``, which re-exports :func:`knob_from_dict`."""

from __future__ import annotations

from typing import Any, Mapping

from inferloom.agents.search_refusals import refused_combinations
from inferloom.workloads.base import Knob, config_key

_INT_FULL = 32  # int knobs with at most this many values are enumerated in full

def knob_from_dict(d: Mapping[str, Any]) -> Knob:
    """Rebuild a :class:`Knob` from ``Knob.to_dict()`` output (JSON-loaded)."""
    choices = d.get("choices")
    return Knob(
        name=str(d["name"]), kind=d["kind"], default=d.get("default"),
        description=str(d.get("description", "")),
        choices=tuple(choices) if choices is not None else None,
        low=d.get("low"), high=d.get("high"),
        applies_to=frozenset(d.get("applies_to", ("cpu", "cuda"))),
        changes_numerics=bool(d.get("changes_numerics", False)),
        phase=d.get("phase", "FRAMEWORK"),
    )



def stock_runs(state: Mapping[str, Any]) -> dict[str, Any]:
    """knob -> value from the state's ``extra.stock_runs`` (what stock's server said it runs)."""
    runs = (state.get("extra") or {}).get("stock_runs") or {}
    return {k: v["value"] for k, v in runs.items() if isinstance(v, Mapping) and "value" in v}


def redundant(changes: Mapping[str, Any], stack: Mapping[str, Any], stock: Mapping[str, Any],
              runs: Mapping[str, Any]) -> dict[str, Any]:
    """Pure: the ``changes`` whose knob is at stock's value in ``stack`` and whose value is what stock's server
    already runs (``runs``): each starts the same server as leaving the knob alone."""
    return {k: v for k, v in changes.items() if k in runs and runs[k] == v and stack.get(k) == stock.get(k)}


class SearchView:
    """What the orchestrator needs from one state dict, parsed once."""

    def __init__(self, state: Mapping[str, Any]) -> None:
        self.knobs = [knob_from_dict(k) for k in state.get("knobs", [])]
        self.by_name = {k.name: k for k in self.knobs}
        self.device = str(state.get("device", "cpu"))
        self.pinned = dict(state.get("pinned") or {})
        base = {k.name: k.default for k in self.knobs}
        self.stock = self.full(state.get("stock_config") or {}, base)
        self.stack = self.full(state.get("stack") or {}, self.stock)
        self.space = [k for k in self.knobs if self.device in k.applies_to and k.name not in self.pinned
                      and k.phase == "FRAMEWORK"
                      and (k.choices if k.kind == "choice" else k.kind == "bool" or None not in (k.low, k.high))]
        self.trials = [t for t in state.get("trials", []) if isinstance(t, Mapping)]
        # (trial, its full config): ``config`` if recorded, else the replayed stack + ``changes``
        self.replayed: list[tuple[Mapping[str, Any], dict[str, Any]]] = []
        stack = self.stock
        for t in self.trials:
            raw = t.get("config") if isinstance(t.get("config"), Mapping) else (
                {**stack, **t["changes"]} if isinstance(t.get("changes"), Mapping) else None)
            if raw is not None:
                self.replayed.append((t, self.full(raw, self.stock)))
                stack = self.replayed[-1][1] if t.get("verdict") == "keep" else stack
        self.seen = {config_key(self.stock), config_key(self.stack)}
        self.seen.update(str(x) for x in state.get("measured_config_keys") or [])
        self.seen.update(config_key(cfg) for _, cfg in self.replayed)
        self.workload = dict(state.get("workload") or {})
        # what the stock server's own log said it runs, where the knob's default says otherwise (server_says)
        self.stock_runs = stock_runs(state)
        # learned from failed / refused trials: banned combinations, suspect patterns (search_refusals.py)
        self.refused, self.suspect = refused_combinations(self)

    def redundant(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """The changes that set a knob still at stock's value to what stock's server already runs."""
        return redundant(changes, self.stack, self.stock, self.stock_runs)

    def full(self, cfg: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
        return {n: cfg.get(n, base[n]) for n in self.by_name}

    def candidate(self, changes: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
        cfg = {**self.stack, **changes}
        return cfg, config_key(cfg)


def _distribution(knob: Knob) -> Any:
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if knob.kind == "int":
        return IntDistribution(int(knob.low), int(knob.high))
    return CategoricalDistribution((False, True) if knob.kind == "bool" else tuple(knob.choices or ()))


def _domain(knob: Knob, keep: Any) -> tuple[list[Any], bool]:
    """Values enumerated for ``knob`` and whether that is its whole domain."""
    if knob.kind == "bool":
        return [False, True], True
    if knob.kind == "choice":
        return list(knob.choices or ()), True
    lo, hi = int(knob.low), int(knob.high)
    if hi - lo < _INT_FULL:
        return list(range(lo, hi + 1)), True
    vals = {lo, hi, knob.default, keep} | {2**i for i in range(hi.bit_length()) if lo <= 2**i <= hi}
    return sorted(v for v in vals if isinstance(v, int) and lo <= v <= hi), False
