"""The measurement protocol: the ONLY code in inferloom that decides
keep / revert / inconclusive.

Contract
--------

Design. A candidate B is compared with a baseline A in *pairs* of timed runs.
Pair ``i`` runs both A and B on the same fresh prompts (prompt seed
``seed_base + i``; distinct across pairs). The order within a pair alternates
A,B then B,A (ABBA counterbalancing, so a linear drift in machine speed
cancels instead of biasing one arm); the order is recorded per pair.

Statistic. ``d_i = log(B_i / A_i)`` per pair (the objective metric, default
output tokens/s); the effect is the mean ``d``, reported as the ratio
``exp(mean d)``. Its confidence interval is a bootstrap of the paired
differences (``scipy.stats.bootstrap``, method BCa; percentile when BCa
is undefined, e.g. for constant data), with a fixed seed so that the same data
always give the same decision.

Small-sample guard (``t_guard``, default on). A bootstrap interval of a mean
of n values cannot reach beyond the data: its lower bound is never below
``min(d)``, and ``P(min(d) > true mean)`` is ``2**-n`` for symmetric noise
(3.1% at n=5), so at the early looks no bootstrap interval can attain a
per-look level of 99%+, and BCa also ignores the ``t`` vs ``z`` small-sample
widening. Simulated (5% lognormal noise per run, defaults, 2000 trials), the
pure bootstrap keeps a candidate whose true gain equals ``min_gain`` in 7.2%
of trials against a nominal <= 2.5%. With the guard the interval used is the
union of the bootstrap interval and the Student-t interval at the same level,
so a decision needs both to clear the threshold: 1.3% in the same simulation
(power at a true +10%: 94% guarded, 98% unguarded; at +5%: 28% vs 55%).
Set ``t_guard=False`` for the pure bootstrap.

Sequential looks. The data are examined at ``n = min_pairs, min_pairs +
pair_step, ..., max_pairs`` (the last look is always ``max_pairs``) and the
run stops at the first decisive look. Looking repeatedly inflates the error
rate, so every look uses a Bonferroni-corrected two-sided confidence
``conf_look = 1 - (1 - confidence) / n_looks`` where ``n_looks`` is the number
of *planned* looks. By the union bound the probability that any look's
interval misses the true mean is at most ``1 - confidence`` (as far as the
bootstrap interval attains its nominal coverage).

Rule. With ``g = log(1 + min_gain)``: **keep** iff the interval's lower bound
is above ``g``; **revert** iff its upper bound is below ``g`` (the candidate
is confidently not worth ``min_gain``); otherwise **continue**, or
**inconclusive** at the last look. A run that fails (``success=False``, or a
record with no valid timing) stops the protocol at once with verdict
**failed**; failures are data and every raw record is kept.

Warm-up is NOT done here: the caller warms each prepared handle
(``settings.warmup_runs`` untimed runs) before calling :func:`run_paired`, and
records compile / warm-up time separately. ``run_a`` / ``run_b`` must only
perform timed runs.

An A/A run (two independently prepared stock handles through
:func:`run_paired`, best with ``stop_early=False``) measures the noise floor;
:func:`noise_floor` reports it.
"""

from __future__ import annotations

import inspect
import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Literal, Sequence

import numpy as np
from scipy import stats

from inferloom.measure.metrics import Metric, output_tokens_per_s
from inferloom.spec import ProtocolSpec, check_bounds, field_default
from inferloom.workloads.base import RunRecord

__all__ = ["Verdict", "ProtocolSettings", "Decision", "Pair", "ProtocolResult",
           "planned_looks", "decide", "run_paired", "noise_floor"]

Verdict = Literal["keep", "revert", "inconclusive", "continue", "failed"]

# scipy >= 1.15 takes ``rng``; older versions take ``random_state``.
_RNG_KW = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"


def _spec(name: str) -> Any:
    return field_default(ProtocolSpec, name)


@dataclass(frozen=True)
class ProtocolSettings:
    """Parameters of the protocol: the spec's ``protocol`` section, built with
    :meth:`from_spec`, plus ``t_guard``. :class:`~inferloom.spec.ProtocolSpec`
    declares every default and bound once; direct construction (tests,
    benchmarks) takes the same defaults and is checked against the same bounds.
    ``min_gain`` reaches the protocol only through these settings."""

    min_gain: float = _spec("min_gain")
    confidence: float = _spec("confidence")
    min_pairs: int = _spec("min_pairs")
    max_pairs: int = _spec("max_pairs")
    pair_step: int = _spec("pair_step")
    warmup_runs: int = _spec("warmup_runs")
    bootstrap_resamples: int = _spec("bootstrap_resamples")
    bootstrap_seed: int = _spec("bootstrap_seed")
    t_guard: bool = True  # also require the Student-t interval to clear g (see module doc); not a spec key

    def __post_init__(self) -> None:
        spec_keys = ProtocolSpec.model_fields
        check_bounds(ProtocolSpec, {k: v for k, v in asdict(self).items() if k in spec_keys}, "protocol")

    @classmethod
    def from_spec(cls, spec: ProtocolSpec) -> "ProtocolSettings":
        return cls(**spec.model_dump())

    def looks(self) -> list[int]:
        return planned_looks(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def planned_looks(settings: ProtocolSettings) -> list[int]:
    """Pair counts at which the data are examined; always ends at ``max_pairs``."""
    looks = list(range(settings.min_pairs, settings.max_pairs + 1, settings.pair_step))
    if looks[-1] != settings.max_pairs:
        looks.append(settings.max_pairs)
    return looks


@dataclass(frozen=True)
class Decision:
    """The outcome of one look. All ``ci_*`` bounds are ratios B/A;
    ``ci_low`` / ``ci_high`` is the interval the verdict used (with the t
    guard, the union of the bootstrap and t intervals). ``method`` is the
    bootstrap method actually used, suffixed ``+t`` when guarded."""

    verdict: Verdict
    n_pairs: int
    mean_log: float
    sd_log: float
    ratio: float
    ci_low: float
    ci_high: float
    confidence: float
    confidence_per_look: float
    n_looks: int
    final: bool
    method: str
    bootstrap_seed: int
    resamples: int
    min_gain: float
    boot_ci_low: float
    boot_ci_high: float
    t_ci_low: float | None  # None when the t guard is off
    t_ci_high: float | None

    @property
    def gain_pct(self) -> float:
        """Observed relative gain of B over A, in percent."""
        return (self.ratio - 1.0) * 100.0

    @property
    def ci_pct(self) -> tuple[float, float]:
        return ((self.ci_low - 1.0) * 100.0, (self.ci_high - 1.0) * 100.0)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gain_pct"] = self.gain_pct
        return d


def _bootstrap_ci(d: np.ndarray, conf: float, settings: ProtocolSettings) -> tuple[float, float, str]:
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DegenerateDataWarning / RuntimeWarning on constant data
            res = stats.bootstrap(
                (d,), np.mean, n_resamples=settings.bootstrap_resamples, confidence_level=conf,
                method=method, vectorized=True,
                **{_RNG_KW: np.random.default_rng(settings.bootstrap_seed)},
            )
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(lo) and math.isfinite(hi):
            return lo, hi, method
    # Unreachable for finite data (percentile bounds are order statistics of means),
    # kept so a surprise can never read as a confident decision.
    return -math.inf, math.inf, "none"


def decide(
    log_ratios: Sequence[float],
    settings: ProtocolSettings,
    *,
    final: bool,
    n_looks: int,
) -> Decision:
    """Decide on paired log-ratios ``log(B/A)``. Pure: same input, same output.

    ``n_looks`` is the number of planned looks (Bonferroni correction);
    ``final`` turns "continue" into "inconclusive"; the threshold is
    ``settings.min_gain``. Needs at least two finite values.
    """
    d = np.asarray(list(log_ratios), dtype=float)
    if d.ndim != 1 or d.size < 2:
        raise ValueError(f"decide: need at least 2 paired log-ratios, got {d.size}")
    if not np.all(np.isfinite(d)):
        raise ValueError("decide: log-ratios must be finite")
    if n_looks < 1:
        raise ValueError(f"decide: n_looks must be >= 1, got {n_looks}")
    gain = settings.min_gain
    conf_look = 1.0 - (1.0 - settings.confidence) / n_looks
    mean = float(d.mean())
    sd = float(d.std(ddof=1))
    blo, bhi, method = _bootstrap_ci(d, conf_look, settings)
    lo, hi = blo, bhi
    t_lo = t_hi = None
    if settings.t_guard:
        half = float(stats.t.ppf(0.5 + conf_look / 2.0, d.size - 1)) * sd / math.sqrt(d.size)
        t_lo, t_hi = mean - half, mean + half
        lo, hi = min(blo, t_lo), max(bhi, t_hi)
        method = f"{method}+t"
    g = math.log1p(gain)
    verdict: Verdict
    if lo > g:
        verdict = "keep"
    elif hi < g:
        verdict = "revert"
    else:
        verdict = "inconclusive" if final else "continue"
    return Decision(
        verdict=verdict, n_pairs=int(d.size), mean_log=mean, sd_log=sd, ratio=math.exp(mean),
        ci_low=math.exp(lo), ci_high=math.exp(hi), confidence=settings.confidence,
        confidence_per_look=conf_look, n_looks=n_looks, final=final, method=method,
        bootstrap_seed=settings.bootstrap_seed, resamples=settings.bootstrap_resamples,
        min_gain=gain, boot_ci_low=math.exp(blo), boot_ci_high=math.exp(bhi),
        t_ci_low=math.exp(t_lo) if t_lo is not None else None,
        t_ci_high=math.exp(t_hi) if t_hi is not None else None,
    )


@dataclass
class Pair:
    """One completed pair: both runs on prompt seed ``seed``, in ``order``."""

    index: int
    seed: int
    order: Literal["AB", "BA"]
    a: RunRecord
    b: RunRecord
    value_a: float
    value_b: float
    log_ratio: float

    def to_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in ("index", "seed", "order", "value_a",
                                                "value_b", "log_ratio")},
                "a": self.a.to_dict(), "b": self.b.to_dict()}


@dataclass
class ProtocolResult:
    """Everything one protocol run produced. ``decision`` is the last look
    (``None`` when it failed before the first look); ``incomplete`` holds the
    raw records of a pair cut short by a failure, as ``(arm, record)``."""

    verdict: Verdict
    pairs: list[Pair]
    decision: Decision | None
    settings: dict[str, Any]
    seed_base: int
    looks: list[Decision] = field(default_factory=list)
    error: str | None = None
    incomplete: list[tuple[str, RunRecord]] = field(default_factory=list)

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
    seed ``seed_base + i`` for both; order is AB for even ``i``, BA for odd.
    ``on_pair(pair, decision)`` is called after each pair, with the look's
    decision when a look happened at that pair, else ``None``.
    ``stop_early=False`` (for A/A noise-floor runs) records every look but
    always runs ``max_pairs`` pairs; the verdict is then the last look's.
    """
    looks_at = planned_looks(settings)
    n_looks = len(looks_at)
    pairs: list[Pair] = []
    looks: list[Decision] = []
    settings_d = settings.to_dict()
    runners = {"A": run_a, "B": run_b}

    for i in range(settings.max_pairs):
        seed = seed_base + i
        order: Literal["AB", "BA"] = "AB" if i % 2 == 0 else "BA"
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
                    incomplete=[(a, recs[a]) for a in order if a in recs],
                )
            vals[arm] = val  # type: ignore[assignment]
        pair = Pair(index=i, seed=seed, order=order, a=recs["A"], b=recs["B"],
                    value_a=vals["A"], value_b=vals["B"],
                    log_ratio=math.log(vals["B"] / vals["A"]))
        pairs.append(pair)
        decision: Decision | None = None
        if len(pairs) in looks_at:
            decision = decide([p.log_ratio for p in pairs], settings,
                              final=len(pairs) == settings.max_pairs, n_looks=n_looks)
            looks.append(decision)
        if on_pair is not None:
            on_pair(pair, decision)
        if decision is not None and decision.verdict != "continue":
            if stop_early or decision.final:
                return ProtocolResult(verdict=decision.verdict, pairs=pairs, decision=decision,
                                      settings=settings_d, seed_base=seed_base, looks=looks)
    raise AssertionError("unreachable: the last planned look is max_pairs and is final")


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
