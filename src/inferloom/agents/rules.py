"""Deterministic default agents: they work offline and the same input always
gives the same output (see the Protocols in ``inferloom.agents.base``).

* :class:`RuleOrchestrator` reads only the state dict. It proposes expert
  priors first (``inferloom.agents.priors``, ranked for device, concurrency and
  the current dtype; with the cross-knob rules each prior gets one measured try), then a search over the knobs that apply to the device
  and are not pinned: an additive model (``search_model.py``; Optuna TPE with
  ``search="tpe"``) that priors alternate with once a trial brings no keep
  (``search_moves.py``). It never proposes a configuration holding a
  combination refused earlier in the session (``search_refusals.py``), nor a full
  configuration that was already measured: stock, the stack, every
  ``trials[i]["config"]`` and every ``measured_config_keys`` entry count as
  measured. When nothing unmeasured is left it answers ``end_phase``.
* :class:`RuleCritic` (``rule_critic.py``) keeps what the session's keep rule admits (measure.keep_rule); its lesson: one line.
* :class:`RuleRobustness` (``rule_robustness.py``) trips on N consecutive failed trials, two identical
  proposals in a row, or no keep for T minutes; else it returns ``None``.

State keys read besides those in ``agents/base.py``: ``pinned`` (knob ->
value, never changed), ``kb_failures`` (change-sets that failed before: such a
prior is tried last, never banned), ``measured_config_keys``, ``proposals``
(change-sets proposed this cycle), ``started_at`` / ``cycle_started_at`` (unix
time), and ``trials[i]["finished_at"]`` / ``["cycle"]``.
"""

from __future__ import annotations

import itertools
import math
import random
import warnings
from typing import Any, Callable, Iterator, Mapping

from inferloom.agents.priors import Prior, rank_priors
from inferloom.agents.rule_critic import RuleCritic
from inferloom.agents.rule_robustness import RuleRobustness
from inferloom.agents.server_priors import default_table
from inferloom.agents.search_moves import alternate_to_search, repair, spent, width
from inferloom.agents.search_model import ucb_proposal
from inferloom.agents.search_priors import claimed_by, prior_means
from inferloom.agents.search_refusals import REFUSED_VERDICTS, contains_refused, suspect
from inferloom.agents.search_view import SearchView, _distribution, _domain, knob_from_dict
from inferloom.workloads.base import ConfigError, Knob

__all__ = ["RuleOrchestrator", "RuleCritic", "RuleRobustness", "knob_from_dict"]

# Objective given to TPE for a trial that failed, was refused or failed quality:
# the log-gain of the stack it was compared with, plus log(0.5).
PENALTY_LOG = math.log(0.5)
MAX_ASKS = 50  # TPE samples per call before falling back to enumeration
ENUM_LIMIT = 20_000  # candidate configurations the enumeration looks at, at most
_BAD = {"failed", "refused", "reject-quality"}


class RuleOrchestrator:
    """Expert priors first, then Optuna TPE; deterministic for a given state.

    ``propose(state)`` returns ``{"action": "try_config", "changes", "predicted_gain",
    "rationale", "source": "prior" | "search"}`` or ``{"action": "end_phase",
    "rationale"}``. TPE is rebuilt in memory on every call from
    ``state["trials"]`` with ``TPESampler(seed=seed + len(trials))``; a trial's
    objective is its log-gain over stock, reconstructed by replaying the trials
    in order from stock (a ``keep`` moves the baseline); failed, refused and
    quality-rejected trials get the baseline's log-gain plus ``log(0.5)``. A
    search proposal changes at most ``max_changes`` knobs (default 1, so every
    kept step is attributable; ``None``: all the knobs the sample changed): a
    sample changing more is cut to a seeded-random subset of them. When
    ``MAX_ASKS`` samples are all measured (or optuna is missing), configs within
    ``max_changes`` of the stack are enumerated, fewest changes first; when
    none is left, ``end_phase``. ``prior_table``
    replaces :data:`~inferloom.agents.priors.DEFAULT_PRIORS`. ``feasible(config)``,
    when given (the engine's cross-knob rules), skips every configuration it
    refuses, so that none costs a trial, and the search completes a refused
    change-set with what the rules need (``search_moves.repair``). ``search``:
    ``"ucb"`` the additive model (``search_model.py``), ``"tpe"`` Optuna TPE,
    ``"auto"`` (default) the model (at most two knobs per proposal, whatever
    ``max_changes``), with or without ``feasible``: a configuration holding a
    combination refused earlier in the session is never proposed again
    (``search_refusals.py``; docs/benchmarks.md section 10).
    ``prior_patience``: after that many trials without a keep, priors and the
    search alternate; ``stall``: a stack that old without a keep widens the
    search to two knobs (``search_moves.py``; None: off). ``priors="slots"`` (the default): the above;
    ``"model"`` (with the model's search, opt-in): no slots for priors; their claimed gains are the model's
    prior means (``search_priors.py``), and a proposal holding a claimed value not yet measured says it comes
    from that prior (not the default: slower on the real engine's table and on fresh prior-aligned seeds,
    docs/benchmarks.md sections 10 and 16). ``prior_tries``: a prior whose change-set that many trials
    already measured as a change (not failed or refused) gets no more slots, the model has its
    measurement (``search_moves.spent``); ``"auto"`` (default): 1 with ``feasible``, None (a prior is
    retried at every new stack) without; tuned on seeds 0-9, made the default only after fresh seeds
    100-109, 200-209 and 300-309 confirmed it (docs/benchmarks.md section 10). ``phase`` is not
    consulted: the coordinator's allowlist decides what is admitted."""

    name = "rule-orchestrator"

    def __init__(self, seed: int = 0, prior_table: Any = None, *, max_changes: int | None = 1,
                 n_startup_trials: int = 5, feasible: Callable[[Mapping[str, Any]], bool] | None = None,
                 prior_patience: int | None = 1, stall: int | None = 6, search: str = "auto",
                 priors: str = "slots", prior_tries: int | str | None = "auto") -> None:
        if max_changes is not None and max_changes < 1:
            raise ValueError("RuleOrchestrator: max_changes must be >= 1 or None")
        self.seed, self.prior_table = int(seed), prior_table
        self.max_changes, self.n_startup_trials = max_changes, int(n_startup_trials)
        self.feasible = feasible  # the engine's cross-knob rules: a configuration they refuse is never proposed
        self.prior_patience, self.stall = prior_patience, stall  # search_moves.py; None: off
        if search not in ("auto", "ucb", "tpe"):
            raise ValueError(f"RuleOrchestrator: search must be 'auto', 'ucb' or 'tpe', got {search!r}")
        self.search = "ucb" if search == "auto" else search
        if priors not in ("slots", "model") or (priors == "model" and self.search != "ucb"):
            raise ValueError(f"RuleOrchestrator: priors must be 'slots' or 'model' (the latter with "
                             f"search 'auto' or 'ucb'), got priors={priors!r}, search={search!r}")
        if prior_tries == "auto":  # spent after one try with the cross-knob rules; without them, retried
            prior_tries = 1 if feasible is not None else None
        if prior_tries is not None and (not isinstance(prior_tries, int) or prior_tries < 1):
            raise ValueError(f"RuleOrchestrator: prior_tries must be 'auto', an int >= 1 or None, got {prior_tries!r}")
        self.priors, self.prior_tries = priors, prior_tries

    def _ok(self, view: "SearchView", changes: Mapping[str, Any]) -> bool:
        """Unmeasured, holding no combination refused before (``search_refusals.py``), and not refused
        by the cross-knob rules (when known)."""
        cfg, key = view.candidate(changes)
        return (key not in view.seen and not contains_refused(cfg, view.refused) and not view.redundant(changes)
                and (self.feasible is None or bool(self.feasible(cfg))))

    def _complete(self, view: SearchView, changes: Mapping[str, Any]) -> dict[str, Any] | None:
        """``changes`` completed for the cross-knob rules (when known), if then unmeasured."""
        out = repair(view, changes, self.feasible) if self.feasible is not None else dict(changes)
        return out if out is not None and self._ok(view, out) else None

    def propose(self, state: Mapping[str, Any]) -> dict[str, Any]:
        view = SearchView(state)
        if not view.space:
            return {"action": "end_phase", "rationale": f"no unpinned knob applies to device {view.device}"}
        if self.priors == "model":  # the priors' claims are the model's prior means: no slots of their own
            return self._search(view, self._claims(view, state))
        if alternate_to_search(view, self.prior_patience):  # the priors stopped helping: search every other slot
            proposal = self._search(view)
            if proposal["action"] == "try_config":
                return proposal
        return self._from_priors(view, state) or self._search(view)

    # ---------------------------------------------------------------- priors
    def _resolve(self, prior: Prior, view: SearchView) -> dict[str, Any] | None:
        """The prior's full change-set checked against the domain, or None."""
        out: dict[str, Any] = {}
        for name, value in prior.changes.items():
            knob = view.by_name.get(name)
            if knob is None or view.device not in knob.applies_to:
                return None
            if knob.kind == "int" and value in ("max", "min"):
                value = knob.high if value == "max" else knob.low
            try:
                value = knob.validate(value)
            except ConfigError:
                return None
            if name in view.pinned and value != view.stack[name]:
                return None
            out[name] = value
        return out

    def _ranked(self, view: SearchView, state: Mapping[str, Any]) -> Iterator[tuple[Prior, dict[str, Any], bool]]:
        """(prior, its full change-set, whether a change-set in it failed before) in rank order."""
        dtype, concurrency = view.stack.get("dtype") or view.workload.get("dtype"), int(view.workload.get("concurrency") or 1)
        failures = [dict(f) for f in state.get("kb_failures") or [] if isinstance(f, Mapping) and f]
        table = default_table(view.by_name, view.workload, state) if self.prior_table is None else self.prior_table
        for prior in rank_priors(view.device, concurrency, dtype, table):
            full = self._resolve(prior, view)
            if full is not None:
                yield prior, full, any(all(k in full and full[k] == v for k, v in f.items()) for f in failures)

    def _claims(self, view: SearchView, state: Mapping[str, Any]) -> dict[tuple[str, Any], tuple[float, Prior]]:
        return prior_means(((p, full) for p, full, failed in self._ranked(view, state) if not failed), view.stock)

    def _from_priors(self, view: SearchView, state: Mapping[str, Any]) -> dict[str, Any] | None:
        first: list[tuple[Prior, dict[str, Any], bool]] = []
        last: list[tuple[Prior, dict[str, Any], bool]] = []
        for prior, full, failed in self._ranked(view, state):
            changes = {k: v for k, v in full.items() if v != view.stack[k]}
            same = view.redundant(changes)  # what stock's server already runs: the same server, left out
            changes = {k: v for k, v in changes.items() if k not in same}
            if not changes or not self._ok(view, changes) or (self.prior_tries is not None and spent(view, full, self.prior_tries)):
                continue
            failed = failed or suspect(view.candidate(changes)[0], view.suspect)  # like a refusal this session
            (last if failed else first).append((prior, changes, failed))
        if not first and not last:
            return None
        prior, changes, failed = (first + last)[0]
        note = " (ranked down: a change in it failed before, or was refused this session)" if failed else ""
        return {
            "action": "try_config", "changes": changes, "predicted_gain": prior.predicted_gain,
            "rationale": f"expert prior '{prior.name}'{note}: {prior.rationale}", "source": "prior",
        }

    # ---------------------------------------------------------------- search
    def _history(self, view: SearchView, feasible_only: bool = False) -> Iterator[tuple[dict[str, Any], float]]:
        """(params, log-gain over stock) per trial; ``feasible_only``: refused and failed trials left out
        (infeasible, not slow: the model's view), else scored with the penalty (TPE's)."""
        base_value = 0.0
        for t, cfg in view.replayed:
            ratio, verdict = t.get("ratio"), t.get("verdict")
            if feasible_only and verdict in REFUSED_VERDICTS:
                continue
            ok = isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and 0 < ratio < math.inf
            if verdict in _BAD or not ok:
                value = base_value + (PENALTY_LOG if verdict in _BAD else 0.0)
            else:
                value = base_value + math.log(ratio)
            params = {k.name: cfg[k.name] for k in view.space}
            if all(self._in_domain(k, params[k.name]) for k in view.space):
                yield params, value
            if verdict == "keep" and ok:
                base_value = value

    @staticmethod
    def _in_domain(knob: Knob, value: Any) -> bool:
        if knob.kind == "bool":
            return isinstance(value, bool)
        try:
            return knob.validate(value) == value
        except ConfigError:
            return False

    def _search(self, view: SearchView, claims: Mapping[tuple[str, Any], tuple[float, Prior]] | None = None) -> dict[str, Any]:
        if self.search == "ucb":
            history = list(self._history(view, feasible_only=True))
            found = ucb_proposal(view, history, min(width(view, self.max_changes, self.stall) or 2, 2),
                                 lambda c: self._complete(view, c), demote=lambda cfg: suspect(cfg, view.suspect),
                                 prior_mean={c: m for c, (m, _) in (claims or {}).items()})
            if found is not None:
                why = (f"additive model over {len(view.space)} knobs given {len(view.replayed)} measured trials"
                       f"{', expert priors as its prior means' if claims else ''}: highest upper confidence bound")
                by = claimed_by(found[0], claims or {}, (p for p, _ in history))
                if by:  # a value only a prior's claim speaks for: proposed because of that prior
                    why = "; ".join(f"expert prior '{p.name}' (claims {p.predicted_gain:+.0%}, not yet measured): "
                                    f"{p.rationale}" for p in by) + f" [{why}]"
                return {"action": "try_config", "changes": found[0], "predicted_gain": math.expm1(found[1]),
                        "rationale": why, "source": "prior" if by else "search"}
        try:
            import optuna
        except ImportError:  # optuna missing (e.g. a bare GPU host): enumerate instead
            return self._enumerate(view, "optuna is not installed")

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        dists = {k.name: _distribution(k) for k in view.space}
        rng = random.Random(self.seed * 1_000_003 + len(view.trials))
        tried: set[str] = set()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sampler = optuna.samplers.TPESampler(seed=self.seed + len(view.trials), n_startup_trials=self.n_startup_trials)
            study = optuna.create_study(direction="maximize", sampler=sampler)
            for params, value in self._history(view):
                study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=value))
            n_known, w = len(study.trials), width(view, self.max_changes, self.stall)
            for _ in range(MAX_ASKS):
                trial = study.ask(dists)  # left running: TPE's constant liar steers off repeats
                diff = [k for k, v in trial.params.items() if v != view.stack[k]]
                rng.shuffle(diff)
                r = min(len(diff), w or len(diff))
                for names in itertools.combinations(diff, r) if r else ():
                    changes = {k: trial.params[k] for k in sorted(names, key=list(dists).index)}
                    if self.feasible is not None:  # complete a refused change-set with what the rules need
                        changes = repair(view, changes, self.feasible) or changes
                    key = view.candidate(changes)[1]
                    if key not in tried and self._ok(view, changes):
                        trimmed = f", {r} of the {len(diff)} knobs it changed" if r < len(diff) else ""
                        trimmed += f", {len(changes) - r} more the cross-knob rules need" if len(changes) > r else ""
                        return {
                            "action": "try_config", "changes": changes, "predicted_gain": None,
                            "rationale": f"TPE sample over {len(dists)} knobs given {n_known} measured "
                            f"trials{trimmed}", "source": "search",
                        }
                    tried.add(key)
        return self._enumerate(view, f"TPE drew only measured configurations in {MAX_ASKS} asks")

    def _enumerate(self, view: SearchView, why: str) -> dict[str, Any]:
        domains = {k.name: _domain(k, view.stack[k.name]) for k in view.space}
        whole = all(full for _, full in domains.values())
        top = min(len(view.space), self.max_changes or len(view.space))
        combos = (
            dict(zip(names, values))
            for r in range(1, top + 1)
            for names in itertools.combinations(list(domains), r)
            for values in itertools.product(*[[v for v in domains[n][0] if v != view.stack[n]] for n in names])
        )
        for looked, changes in enumerate(itertools.islice(combos, ENUM_LIMIT + 1)):
            if looked == ENUM_LIMIT:
                whole = False
            elif self._ok(view, changes):
                return {
                    "action": "try_config", "changes": changes, "predicted_gain": None,
                    "rationale": f"{why}; first unmeasured configuration changing {len(changes)} "
                    "knob(s), in enumeration order",
                    "source": "search",
                }
        scope = "every" if whole and top == len(view.space) else "every enumerated"
        within = f" within {top} change(s) of the stack" if top < len(view.space) else ""
        return {"action": "end_phase", "rationale": f"search space exhausted: {scope} configuration"
                f"{within} over the {len(view.space)} searchable knobs was already measured"}
