"""Search efficiency (issue 15): the default orchestrator (expert priors in slots, each spent after one
measured try with the cross-knob rules, then its additive-model search, agents/search_model.py; refusals
learned as it goes without the engine's cross-knob rules: agents/search_refusals.py; the priors' claims as
the model's prior means is opt-in, agents/search_priors.py) against Optuna TPE alone, random search and a grid, on synthetic
landscapes over the real CPU engine's FRAMEWORK knob space (llama-tiny:
dtype, attention, SDPA backend, cache, compile mode, micro-batch, threads,
prompt lookup, decode loop; 126,720 configurations).

A landscape is a log-throughput: main effects per knob value, pairwise
interactions between random knob pairs, and multiplicative measurement noise;
infeasible regions are the engine's own cross-knob refusals
(``check_applicable``: e.g. prompt_lookup needs micro_batch=1 and the dynamic
cache; static_loop needs the static cache): such a configuration is a failed
trial that costs its slot. The best known is found by enumerating every
configuration. Two families:

* ``prior-aligned``: the main effects are drawn around what the expert priors
  claim for CPU (compile +30%, static cache +2%, ...; ``agents/priors.py``),
  each perturbed, plus random effects on the other values: the world the
  priors were written for;
* ``random``: every effect drawn at random: the priors know nothing.

Each strategy gets the same trial budget. The default orchestrator runs as
in a session: each proposal is measured against the current stack (ratio =
true ratio x noise) and kept when the ratio clears 1.02, which moves the
stack. The others evaluate full configurations. Reported per family and
budget (mean over seeds): the best true gain found as a fraction of the best
known gain (in log space), and the trials needed to reach 95% of it (the
budget + 1 when never reached). No wall-clock: trials are the currency.

    PYTHONPATH=src .venv/bin/python benchmarks/search_efficiency.py --seeds 10 --budget 40
    ... --seed-start 100   # fresh landscapes, never looked at while tuning (seeds 0-9 were)
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import statistics
import warnings
from typing import Any, Callable

from inferloom.agents.priors import DEFAULT_PRIORS
from inferloom.agents.rules import RuleOrchestrator
from inferloom.spec import load_spec
from inferloom.workloads.base import AdapterError, Knob, config_key
from inferloom.workloads.registry import make_adapter
from inferloom.workloads.transformers_knobs import check_applicable

KEEP_RATIO = 1.02
NOISE_SD = 0.03


def knob_space() -> tuple[list[Knob], list[Knob], dict[str, list[Any]]]:
    knobs = make_adapter(load_spec(None, {"model": "llama-tiny", "device": "cpu"})).knob_space()
    space = [k for k in knobs if k.phase == "FRAMEWORK" and "cpu" in k.applies_to]
    dom = {k.name: (list(k.choices) if k.kind == "choice" else [False, True] if k.kind == "bool"
                    else list(range(int(k.low), int(k.high) + 1))) for k in space}
    return knobs, space, dom


class Landscape:
    def __init__(self, family: str, seed: int, knobs: list[Knob], space: list[Knob], dom: dict[str, list[Any]]):
        rng = random.Random(seed * 7919 + (0 if family == "random" else 1))
        self.knobs, self.space, self.dom = knobs, space, dom
        self.stock = {k.name: k.default for k in knobs}
        self.main = {(n, v): (0.0 if v == self.stock[n] else rng.gauss(0.0, 0.08)) for n, vs in dom.items() for v in vs}
        if family == "prior-aligned":
            for p in DEFAULT_PRIORS:
                if "cpu" in p.devices and len(p.changes) == 1:
                    (n, v), = p.changes.items()
                    v = max(dom[n]) if v == "max" else v
                    if (n, v) in self.main:
                        self.main[(n, v)] = math.log1p(p.predicted_gain) * rng.uniform(0.5, 1.5)
        names = list(dom)
        self.pairs = {}
        for a, b in rng.sample(list(itertools.combinations(names, 2)), 4):
            for va in dom[a]:
                for vb in dom[b]:
                    if va != self.stock[a] and vb != self.stock[b]:
                        self.pairs[(a, va, b, vb)] = rng.gauss(0.0, 0.08)
        self.pair_names = {(a, b) for a, _, b, _ in self.pairs}
        self.noise = random.Random(seed * 104729 + 17)
        self.best = max(self.value(c) for c in self.all_configs() if self.feasible(c))

    def full(self, cfg: dict[str, Any]) -> dict[str, Any]:
        return {**self.stock, **cfg}

    def all_configs(self):
        names = list(self.dom)
        for vals in itertools.product(*(self.dom[n] for n in names)):
            yield self.full(dict(zip(names, vals)))

    def feasible(self, cfg: dict[str, Any]) -> bool:
        return self.refusal(cfg) is None

    def refusal(self, cfg: dict[str, Any]) -> str | None:
        """The engine's refusal message for ``cfg`` (what a session's trial records), else None."""
        try:
            check_applicable(self.knobs, cfg, "cpu")
            return None
        except AdapterError as exc:
            return str(exc)

    def value(self, cfg: dict[str, Any]) -> float:
        """True log-throughput over stock."""
        v = sum(self.main[(n, cfg[n])] for n in self.dom)
        for a, b in self.pair_names:
            v += self.pairs.get((a, cfg[a], b, cfg[b]), 0.0)
        return v

    def measure(self, cfg: dict[str, Any]) -> float | None:
        return self.value(cfg) + self.noise.gauss(0.0, NOISE_SD) if self.feasible(cfg) else None


def run_default(ls: Landscape, seed: int, budget: int, priors: bool = True, rules: bool = False,
                priors_in: str | None = None, on_trial: Callable[[dict[str, Any], str, float], None] | None = None,
                **orchestrator: Any) -> list[float]:
    """True values of the configurations measured, in order (-inf: infeasible). ``rules``: the
    orchestrator knows the engine's cross-knob rules (``feasible``). ``on_trial(proposal, verdict, true value)``:
    called after each trial (benchmarks/search_trace.py)."""
    o = RuleOrchestrator(seed=seed, prior_table=None if priors else [], feasible=ls.feasible if rules else None,
                         **({"priors": priors_in} if priors_in else {}), **orchestrator)
    stock = ls.stock
    state: dict[str, Any] = {"device": "cpu", "knobs": [k.to_dict() for k in ls.knobs], "pinned": {},
                             "stock_config": stock, "stack": dict(stock), "trials": [],
                             "measured_config_keys": [config_key(stock)], "proposals": [], "kb_failures": [],
                             "workload": {"concurrency": 8, "dtype": "float32"}, "cycle": 1}
    out: list[float] = []
    while len(out) < budget:
        raw = o.propose(state)
        if raw.get("action") != "try_config":
            break
        cfg = {**state["stack"], **raw["changes"]}
        m = ls.measure(cfg)
        base = ls.value(state["stack"])
        ratio = None if m is None else math.exp(m - base)
        verdict = "failed" if m is None else "keep" if ratio > KEEP_RATIO else "revert"
        # a refused trial's lesson quotes the engine's message, as the rule critic writes it in a session
        lesson = f"{raw['changes']}: protocol verdict failed ({ls.refusal(cfg)})" if m is None else ""
        state["trials"].append({"changes": raw["changes"], "config": cfg, "verdict": verdict, "ratio": ratio,
                                "cycle": 1, "lesson": lesson})
        state["measured_config_keys"].append(config_key(cfg))
        out.append(ls.value(cfg) if m is not None else -math.inf)
        if on_trial is not None:
            on_trial(raw, verdict, out[-1])
        if verdict == "keep":
            state["stack"] = cfg
    return out


def run_tpe(ls: Landscape, seed: int, budget: int, feasible_only: bool = False) -> list[float]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out: list[float] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))

        def sample(trial: Any) -> dict[str, Any]:
            return ls.full({n: trial.suggest_categorical(n, vs) if not isinstance(vs[0], int) or isinstance(vs[0], bool)
                            else trial.suggest_int(n, vs[0], vs[-1]) for n, vs in ls.dom.items()})

        while len(out) < budget:
            trial = study.ask()
            cfg = sample(trial)
            if feasible_only and not ls.feasible(cfg):  # refused before it costs a trial: TPE still learns
                study.tell(trial, math.log(0.5))
                continue
            m = ls.measure(cfg)
            out.append(ls.value(cfg) if m is not None else -math.inf)
            study.tell(trial, m if m is not None else math.log(0.5))
    return out


def run_random(ls: Landscape, seed: int, budget: int) -> list[float]:
    """Uniform over the feasible configurations (rejection: an infeasible draw costs nothing)."""
    rng = random.Random(seed)
    out = []
    while len(out) < budget:
        cfg = ls.full({n: rng.choice(vs) for n, vs in ls.dom.items()})
        if ls.feasible(cfg):
            out.append(ls.value(cfg) if ls.measure(cfg) is not None else -math.inf)
    return out


def run_grid(ls: Landscape, seed: int, budget: int) -> list[float]:
    """A coarse grid (ints at low / middle / high), its feasible points in a seeded random order."""
    coarse = {n: (vs if not isinstance(vs[0], int) or isinstance(vs[0], bool) or len(vs) <= 3
                  else sorted({vs[0], vs[len(vs) // 2], vs[-1]})) for n, vs in ls.dom.items()}
    grid = [g for g in (ls.full(dict(zip(coarse, vals))) for vals in itertools.product(*coarse.values()))
            if ls.feasible(g)]  # the feasible grid points only
    random.Random(seed).shuffle(grid)
    out = []
    for cfg in grid[:budget]:
        cfg = ls.full(cfg)
        out.append(ls.value(cfg) if ls.measure(cfg) is not None else -math.inf)
    return out


STRATEGIES: dict[str, Callable[[Landscape, int, int], list[float]]] = {
    "default, no cross-knob rules (refusals learned as it goes; priors in slots)": run_default,  # prior_tries None
    "priors, then TPE, no cross-knob rules (the previous fallback)": lambda ls, s, b: run_default(
        ls, s, b, search="tpe", prior_patience=None, stall=None),
    "default + cross-knob rules (priors in slots, spent after one try)": lambda ls, s, b: run_default(
        ls, s, b, rules=True),
    "previous default + cross-knob rules (priors retried at every new stack)": lambda ls, s, b: run_default(
        ls, s, b, rules=True, prior_tries=None),
    "priors in the model, no cross-knob rules (not the default)": lambda ls, s, b: run_default(
        ls, s, b, priors_in="model"),
    "priors in the model + cross-knob rules (not the default)": lambda ls, s, b: run_default(
        ls, s, b, rules=True, priors_in="model"),
    "priors spent after one try, no cross-knob rules (not the default)": lambda ls, s, b: run_default(
        ls, s, b, prior_tries=1),
    "default search alone + cross-knob rules (no priors)": lambda ls, s, b: run_default(ls, s, b, priors=False,
                                                                                         rules=True),
    "TPE alone (orchestrator's TPE, no priors)": lambda ls, s, b: run_default(ls, s, b, priors=False, search="tpe",
                                                                               stall=None),
    "TPE alone + cross-knob rules": lambda ls, s, b: run_default(ls, s, b, priors=False, rules=True, search="tpe",
                                                                  stall=None),
    "Optuna TPE, full configs": run_tpe,
    "Optuna TPE, full configs, infeasible free": lambda ls, s, b: run_tpe(ls, s, b, feasible_only=True),
    "random (feasible only)": run_random,
    "grid (coarse, feasible only)": run_grid}


def score(values: list[float], best: float, budgets: list[int]) -> tuple[dict[int, float], int, int]:
    """Best found (fraction of the best known log-gain) by budget, trials to 95%, infeasible trials."""
    frac, running, reach = {}, 0.0, None
    for i, v in enumerate(values, 1):
        running = max(running, v)
        if reach is None and running >= 0.95 * best:
            reach = i
    for b in budgets:
        frac[b] = max([0.0] + values[:b]) / best
    return frac, reach or (max(budgets) + 1), sum(1 for v in values if v == -math.inf)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--seed-start", type=int, default=0, help="first landscape seed (fresh seeds: e.g. 100)")
    ap.add_argument("--only", action="append", help="run only the strategies whose name contains this (repeatable)")
    ap.add_argument("--json", help="write the raw results here")
    args = ap.parse_args()
    budgets = [b for b in (5, 10, 20, 40, 80) if b <= args.budget]
    knobs, space, dom = knob_space()
    results: dict[str, Any] = {}
    for family in ("prior-aligned", "random"):
        strategies = {n: f for n, f in STRATEGIES.items() if not args.only or any(o in n for o in args.only)}
        rows: dict[str, list[tuple[dict[int, float], int, int]]] = {name: [] for name in strategies}
        bests = []
        for seed in range(args.seed_start, args.seed_start + args.seeds):
            ls = Landscape(family, seed, knobs, space, dom)
            bests.append(math.exp(ls.best))
            for name, fn in strategies.items():
                ls.noise = random.Random(seed * 104729 + 17)  # the same noise stream for every strategy
                rows[name].append(score(fn(ls, seed, args.budget), ls.best, budgets))
        print(f"\n{family}: best known x{statistics.mean(bests):.3f} over stock (mean of {args.seeds} landscapes)")
        print(f"| strategy | " + " | ".join(f"best found @{b}" for b in budgets) + " | trials to 95% | infeasible tried |")
        print("| --- " * (len(budgets) + 3) + "|")
        results[family] = {}
        for name, rs in rows.items():
            means = {b: statistics.mean(r[0][b] for r in rs) for b in budgets}
            reach = statistics.mean(r[1] for r in rs)
            never = sum(1 for r in rs if r[1] > args.budget)
            infeasible = statistics.mean(r[2] for r in rs)
            results[family][name] = {"best_fraction": means, "trials_to_95": reach, "never_reached": never,
                                     "infeasible": infeasible}
            print(f"| {name} | " + " | ".join(f"{means[b] * 100:.0f}%" for b in budgets) +
                  f" | {reach:.1f} ({never} never) | {infeasible:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
