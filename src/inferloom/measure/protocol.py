"""The measurement protocol: the ONLY code in inferloom that decides
keep / revert / inconclusive.

Contract
--------

Design. A candidate B is compared with a baseline A in *pairs* of timed runs.
Pair ``i`` runs both A and B on the same fresh prompts (prompt seed
``seed_base + i``; distinct across pairs). The order within a pair alternates
A,B then B,A (ABBA counterbalancing, so a linear drift in machine speed, or an
advantage for whichever run goes second, cancels over two pairs instead of
biasing one arm); the order is recorded per pair. ``d_i = log(B_i / A_i)`` per
pair (the objective metric, default output tokens/s).

Decision (``settings.design``). ``sequential`` (the default): looks at
``n = min_pairs, min_pairs + pair_step, ..., max_pairs``; at each, the
trimmed mean of ``d`` and its Yuen standard error, a keep boundary from an
error-spending group-sequential design (false keep at most
``(1 - confidence) / 2`` over all looks), a pair budget sized from the noise
(the A/A's sd pooled with the pairs so far) for ``power`` at ``target_gain``,
and a non-binding futility stop once ``target_gain`` is out of reach. The
decision is one pure function, :func:`sequential_decision` (the statistics in
:mod:`inferloom.measure.sequential`); each decision states why it stopped
(``stop``, ``reason``) and keeps its interval (``ci_low`` / ``ci_high``).
``bonferroni`` (results written before): Bonferroni-corrected looks, a
bootstrap interval united with the t interval
(:mod:`inferloom.measure.protocol_bootstrap`). Calibration of both: docs/protocol.md.

Rule. With ``g = log(1 + min_gain)`` (sequential: ``log((1 + min_gain)(1 +
floor))``, ``floor`` the session A/A's, :mod:`inferloom.measure.keep_rule`):
**keep** iff the interval's lower bound is above ``g``; **revert** iff its upper bound is below ``g`` or (sequential)
the futility test rejects ``target_gain``; otherwise **continue**, or
**inconclusive** at the final look (sequential: the look that reaches the
budget). Sequential, before the first look: the **harm stop** (:func:`harm_stop`,
``settings.harm_ratio``, 0 disables) reverts after pair ``k >= 2`` when every pair
so far is grossly slower (below the harm ratio and far below 1 for the A/A's
noise): it only reverts, and at a true ratio of at least 1 it stops with
probability at most 0.1% (:mod:`inferloom.measure.sequential`). A run that fails (``success=False``, or a record with no valid
timing) stops the protocol at once with verdict **failed**; failures are data
and every raw record is kept.

Warm-up is NOT done here: the caller warms each prepared handle
(``settings.warmup_runs`` untimed runs) before calling :func:`run_paired`, and
records compile / warm-up time separately. ``run_a`` / ``run_b`` must only
perform timed runs.

A compile is warm-up. A pair in which either run's record has a non-empty
``extra['server_jit']`` (its server's own log said it JIT-compiled a kernel
during the timed requests: :mod:`inferloom.workloads.server_jit`) does not
enter the decision: it is kept in ``ProtocolResult.remeasured`` with its
``reason``, no look and no harm stop is taken on it, and its slot (index,
order) runs again on fresh prompts (:mod:`inferloom.measure.protocol_remeasure`),
at most ``settings.jit_remeasures`` times per protocol run (0: never). Once
they are used, such a pair counts like any other: the compile recurs, and is
part of the configuration's cost. The A/A follows the same rule. Why the
calibration (docs/protocol.md: the false keep at most ``(1 - confidence) / 2``,
the power at ``target_gain``) still holds: it rests on the counted pairs being
independent draws of the steady-state paired ratio, taken at the planned
looks. Whether a pair is voided depends on the server's log line alone, never
on a measured value, and on either arm's compile alike: no pair is chosen by
its outcome (dropping slow pairs would bias the estimate and raise the false
keep), the counted pairs are the slots' compile-free attempts, each an
independent draw, and the looks, the budget and the harm stop see the same
number of them as before. What they estimate is the steady state the protocol
always claimed (warm-up excluded); the bound keeps a compile that recurs in the
data.

An A/A run (two independently prepared stock handles through
:func:`run_paired` with ``stop_early=False``: every pair runs, the budget is
``max_pairs``) measures the noise floor; :func:`noise_floor` reports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np
from scipy import stats

from inferloom.measure.keep_rule import aa_floor
from inferloom.measure.metrics import Metric, output_tokens_per_s
from inferloom.measure.protocol_bootstrap import decide
from inferloom.measure.protocol_remeasure import pair_jit, remeasure_reason, remeasure_seed
from inferloom.measure.protocol_types import Decision, ProtocolSettings, Verdict, planned_looks
from inferloom.measure.sequential import HARM_MIN_PAIRS, SeqLook, harm_look, sequential_look
from inferloom.workloads.base import RunRecord

__all__ = ["Verdict", "ProtocolSettings", "Decision", "Pair", "ProtocolResult", "planned_looks", "decide",
           "sequential_decision", "decision_at", "harm_stop", "first_harm_stop", "run_paired", "with_prior", "noise_floor"]


def sequential_decision(log_ratios: Sequence[float], settings: ProtocolSettings, *,
                        every_pair: bool = False) -> SeqLook:
    """THE decision of the sequential design on the pairs so far: the looks at the planned pair counts up
    to ``len(log_ratios)``, stopping at the first decisive or final one, which is returned. Pure.
    ``every_pair`` (an A/A): the budget is ``max_pairs`` whatever the noise, and every look is taken."""
    d = np.asarray(list(log_ratios), dtype=float)
    if d.ndim != 1 or d.size < 2 or not np.all(np.isfinite(d)):
        raise ValueError(f"sequential_decision: need at least 2 finite paired log-ratios, got {d.size}")
    looks = [n for n in planned_looks(settings) if n <= d.size]
    if not looks:
        raise ValueError(f"sequential_decision: {d.size} pairs is before the first look ({settings.min_pairs})")
    out = sequential_look(
        d, looks, alpha=settings.alpha, beta=settings.futility_error, power=settings.power,
        min_gain=settings.min_gain, target_gain=settings.target_gain, trim=settings.trim,
        rho=settings.spending_power, max_pairs=settings.max_pairs, prior_sd=settings.prior_sd,
        prior_df=settings.prior_df, until_decisive=not every_pair,
        fixed_budget=settings.max_pairs if every_pair else None, floor=settings.floor)
    return out[-1]


def _as_decision(lk: SeqLook, d: np.ndarray, settings: ProtocolSettings, n_looks: int) -> Decision:
    level = 1.0 - 2.0 * float(stats.t.sf(lk.c_t, lk.df)) if math.isfinite(lk.c_t) else 1.0
    return Decision(
        verdict=lk.verdict, n_pairs=lk.n_pairs, mean_log=lk.mean, sd_log=float(d[:lk.n_pairs].std(ddof=1)),
        ratio=math.exp(lk.mean), ci_low=math.exp(lk.lo), ci_high=math.exp(lk.hi), confidence=settings.confidence,
        confidence_per_look=level, n_looks=n_looks, final=lk.final, method="trimmed-t", bootstrap_seed=None,
        resamples=None, min_gain=settings.min_gain, boot_ci_low=None, boot_ci_high=None, t_ci_low=None,
        t_ci_high=None, design="sequential", stop=lk.stop, reason=lk.reason, se_log=lk.se, df=lk.df,
        budget=lk.budget, sigma_budget=lk.sigma, info_fraction=lk.t, alpha_spent=lk.alpha_spent,
        beta_spent=lk.beta_spent, crit_keep_z=lk.c_z, crit_keep=lk.c_t, crit_futility=lk.f_t,
        futility_high=math.exp(lk.fut_hi) if lk.fut_hi is not None else None, futility_gain=math.exp(lk.g_fut),
        target_gain=settings.target_gain, floor=settings.floor)


def decision_at(log_ratios: Sequence[float], settings: ProtocolSettings, *, every_pair: bool = False) -> Decision:
    """The :class:`Decision` of the look on all of ``log_ratios`` (a planned pair count) in either design.
    Sequential: a look the budget has already made final earlier is not taken again (``run_paired``
    stops there), except with ``every_pair`` (A/A)."""
    d = np.asarray(list(log_ratios), dtype=float)
    n_looks = len(planned_looks(settings))
    if settings.design == "bonferroni":
        return decide(d, settings, final=d.size == settings.max_pairs, n_looks=n_looks)
    return _as_decision(sequential_decision(d, settings, every_pair=every_pair), d, settings, n_looks)


def harm_stop(log_ratios: Sequence[float], settings: ProtocolSettings) -> Decision | None:
    """The harm stop's decision on the pairs so far (sequential design, ``HARM_MIN_PAIRS <= len <
    min_pairs``, ``harm_ratio`` > 0): a ``revert`` :class:`Decision` with ``stop == "harm"`` when every
    pair is below the harm bound (:func:`inferloom.measure.sequential.harm_look`), else None. Pure.
    :func:`run_paired` asks it after every pair before the first look; the first one that stops ends the run."""
    d = np.asarray(list(log_ratios), dtype=float)
    if (settings.design != "sequential" or not settings.harm_ratio or not HARM_MIN_PAIRS <= d.size < settings.min_pairs
            or not np.all(np.isfinite(d))):
        return None
    hk = harm_look(d, harm_ratio=settings.harm_ratio, prior_sd=settings.prior_sd)
    if hk is None or not hk.stop:
        return None
    return Decision(
        verdict="revert", n_pairs=hk.n_pairs, mean_log=hk.mean, sd_log=float(d.std(ddof=1)), ratio=math.exp(hk.mean),
        ci_low=math.exp(float(d.min())), ci_high=math.exp(hk.worst), confidence=settings.confidence,
        confidence_per_look=1.0 - hk.error, n_looks=len(planned_looks(settings)), final=False, method="harm",
        bootstrap_seed=None, resamples=None, min_gain=settings.min_gain, boot_ci_low=None, boot_ci_high=None,
        t_ci_low=None, t_ci_high=None, design="sequential", stop="harm", reason=hk.reason,
        target_gain=settings.target_gain, floor=settings.floor, harm_bound=math.exp(hk.bound), harm_sd=hk.sd)


def first_harm_stop(log_ratios: Sequence[float], settings: ProtocolSettings) -> Decision | None:
    """The harm stop :func:`run_paired` would make on these pairs: the first pair count ``k`` (from
    ``HARM_MIN_PAIRS``, before the first look, at most ``len(log_ratios)``) at which :func:`harm_stop`
    reverts, else None. Pure."""
    d = list(log_ratios)
    for k in range(HARM_MIN_PAIRS, min(len(d), settings.min_pairs - 1) + 1):
        dec = harm_stop(d[:k], settings)
        if dec is not None:
            return dec
    return None


@dataclass
class Pair:
    """One completed pair: both runs on prompt seed ``seed``, in ``order``. ``remeasure`` > 0: the
    ``remeasure``-th pair of its protocol run that was measured again (a server JIT-compiled during one of
    its runs), not in the decision, ``reason`` says why; 0 (and no such keys in :meth:`to_dict`): counted."""

    index: int
    seed: int
    order: Literal["AB", "BA"]
    a: RunRecord
    b: RunRecord
    value_a: float
    value_b: float
    log_ratio: float
    remeasure: int = 0
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in ("index", "seed", "order", "value_a",
                                                "value_b", "log_ratio")},
                "a": self.a.to_dict(), "b": self.b.to_dict(),
                **({"remeasure": self.remeasure, "reason": self.reason} if self.remeasure else {})}


@dataclass
class ProtocolResult:
    """Everything one protocol run produced. ``decision`` is the last look
    (``None`` when it failed before the first look); ``incomplete`` holds the
    raw records of a pair cut short by a failure, as ``(arm, record)``;
    ``remeasured`` the pairs measured again (a server JIT compile), in order,
    none of them in ``pairs`` or in any look."""

    verdict: Verdict
    pairs: list[Pair]
    decision: Decision | None
    settings: dict[str, Any]
    seed_base: int
    looks: list[Decision] = field(default_factory=list)
    error: str | None = None
    incomplete: list[tuple[str, RunRecord]] = field(default_factory=list)
    remeasured: list[Pair] = field(default_factory=list)

    @property
    def log_ratios(self) -> list[float]:
        return [p.log_ratio for p in self.pairs]

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "error": self.error,
            "seed_base": self.seed_base,
            "settings": dict(self.settings),
            "decision": self.decision.to_dict() if self.decision else None,
            "looks": [lk.to_dict() for lk in self.looks],
            "pairs": [p.to_dict() for p in self.pairs],
            "remeasured": [p.to_dict() for p in self.remeasured],
            "incomplete": [{"arm": arm, "record": rec.to_dict()} for arm, rec in self.incomplete],
        }


def _value_or_error(rec: RunRecord, metric: Metric) -> tuple[float | None, str | None]:
    if not rec.success:
        return None, rec.error or "run reported failure without an error message"
    try:
        v = float(metric(rec))
    except ValueError as exc:
        return None, f"invalid record: {exc}"
    if not math.isfinite(v) or v <= 0.0:
        return None, f"invalid record: metric value {v!r} is not a positive number"
    return v, None


def run_paired(
    run_a: Callable[[int], RunRecord],
    run_b: Callable[[int], RunRecord],
    settings: ProtocolSettings,
    *,
    seed_base: int,
    on_pair: Callable[[Pair, Decision | None], None] | None = None,
    metric: Metric = output_tokens_per_s,
    stop_early: bool = True,
) -> ProtocolResult:
    """Run pairs of timed runs of A (baseline) and B (candidate) until decisive.

    ``run_a(seed)`` / ``run_b(seed)`` perform ONE timed run each on prompts
    drawn from ``seed`` (already warmed up by the caller). Pair ``i`` uses
    seed ``seed_base + i`` for both (its repeat after the ``k``-th pair measured
    again: ``seed_base + max_pairs + k - 1``); order is AB for even ``i``, BA for odd.
    ``on_pair(pair, decision)`` is called after each pair, with the look's
    decision when a look happened at that pair, else ``None``; also after a
    pair measured again (``pair.remeasure`` > 0, decision ``None``), before
    its slot runs again (the module's contract, "A compile is warm-up").
    ``stop_early=False`` (for A/A noise-floor runs) records every look but
    always runs ``max_pairs`` pairs; the verdict is then the last look's.
    Before the first look (sequential design) every pair from the second asks
    :func:`harm_stop`; a harm stop is recorded as the only look.
    """
    looks_at = planned_looks(settings)
    pairs: list[Pair] = []
    remeasured: list[Pair] = []
    looks: list[Decision] = []
    settings_d = settings.to_dict()
    runners = {"A": run_a, "B": run_b}

    for i in range(settings.max_pairs):
        seed = seed_base + i
        order: Literal["AB", "BA"] = "AB" if i % 2 == 0 else "BA"
        while True:
            recs: dict[str, RunRecord] = {}
            vals: dict[str, float] = {}
            for arm in order:
                rec = runners[arm](seed)
                recs[arm] = rec
                val, err = _value_or_error(rec, metric)
                if err is not None:
                    return ProtocolResult(
                        verdict="failed", pairs=pairs, decision=looks[-1] if looks else None,
                        settings=settings_d, seed_base=seed_base, looks=looks,
                        error=f"run {arm} of pair {i} (seed {seed}, config {rec.config_id!r}): {err}",
                        incomplete=[(a, recs[a]) for a in order if a in recs], remeasured=remeasured,
                    )
                vals[arm] = val  # type: ignore[assignment]
            pair = Pair(index=i, seed=seed, order=order, a=recs["A"], b=recs["B"],
                        value_a=vals["A"], value_b=vals["B"],
                        log_ratio=math.log(vals["B"] / vals["A"]))
            jit = pair_jit(recs)  # the server's log line alone decides, never the values
            if not jit or len(remeasured) >= settings.jit_remeasures:
                break
            pair.remeasure, pair.reason = len(remeasured) + 1, remeasure_reason(jit)
            remeasured.append(pair)
            if on_pair is not None:
                on_pair(pair, None)
            seed = remeasure_seed(seed_base, settings.max_pairs, len(remeasured))
        pairs.append(pair)
        decision: Decision | None = None
        if len(pairs) in looks_at:
            decision = decision_at([p.log_ratio for p in pairs], settings, every_pair=not stop_early)
            looks.append(decision)
        elif stop_early and len(pairs) < looks_at[0]:  # before the first look: only the harm stop may end it
            decision = harm_stop([p.log_ratio for p in pairs], settings)
            if decision is not None:
                looks.append(decision)
        if on_pair is not None:
            on_pair(pair, decision)
        if decision is not None and decision.verdict != "continue":
            if stop_early or decision.final:
                return ProtocolResult(verdict=decision.verdict, pairs=pairs, decision=decision,
                                      settings=settings_d, seed_base=seed_base, looks=looks, remeasured=remeasured)
    raise AssertionError("unreachable: the last planned look is max_pairs and is final")


def with_prior(settings: ProtocolSettings, noise: Mapping[str, Any] | None) -> ProtocolSettings:
    """``settings`` with the session's A/A in it (sequential design; a noise block from :func:`noise_floor`):
    its per-pair sd as the budget's prior and its floor (:func:`inferloom.measure.keep_rule.aa_floor`),
    which a keep clears on top of ``min_gain``. Unchanged without an A/A or for the bonferroni design (its
    session still applies the floor: :func:`inferloom.measure.keep_rule.session_keep`)."""
    if settings.design != "sequential" or not noise:
        return settings
    settings = replace(settings, floor=aa_floor(noise))
    sd, n = noise.get("sd_log_ratio"), noise.get("n_pairs")
    if not isinstance(sd, (int, float)) or not math.isfinite(sd) or sd < 0 or not isinstance(n, int) or n < 2:
        return settings
    return replace(settings, prior_sd=float(sd), prior_df=n - 1)


def noise_floor(result: ProtocolResult) -> dict[str, Any]:
    """Noise summary of an A/A result (two independently prepared stock handles).

    ``sd_log_ratio``: sample sd of per-pair ``log(B/A)``; ``sd_run_est``: the
    implied per-run relative noise (``sd / sqrt(2)``); ``ci_half_width_pct``:
    half the final interval's log width, as a relative gain in percent (the
    smallest effect this many pairs can resolve); ``ratio`` and
    ``ci_low`` / ``ci_high``: observed ratio and interval (ratio 1 expected).
    """
    if result.decision is None or len(result.pairs) < 2:
        raise ValueError("noise_floor: the result has no completed look (failed too early)")
    d = result.decision
    half = (math.log(d.ci_high) - math.log(d.ci_low)) / 2.0
    lrs = result.log_ratios
    sd = float(np.std(lrs, ddof=1))
    return {
        "n_pairs": len(lrs), "sd_log_ratio": sd, "sd_run_est": sd / math.sqrt(2.0),
        "ci_half_width_log": half, "ci_half_width_pct": math.expm1(half) * 100.0,
        "ratio": d.ratio, "gain_pct": d.gain_pct, "ci_low": d.ci_low, "ci_high": d.ci_high,
        "confidence_per_look": d.confidence_per_look, "verdict": result.verdict,
        "contains_one": d.ci_low <= 1.0 <= d.ci_high,
    }
