"""The protocol's settings and the record of one look (:class:`Decision`),
shared by the two decision designs (:mod:`inferloom.measure.sequential`, the
default, and :mod:`inferloom.measure.protocol_bootstrap`, the earlier one) and
by :mod:`inferloom.measure.protocol`, which runs the pairs. See the protocol
module for the contract."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from inferloom.spec import ProtocolSpec, check_bounds, field_default

__all__ = ["Verdict", "ProtocolSettings", "Decision", "planned_looks"]

Verdict = Literal["keep", "revert", "inconclusive", "continue", "failed"]


def _spec(name: str) -> Any:
    return field_default(ProtocolSpec, name)


@dataclass(frozen=True)
class ProtocolSettings:
    """Parameters of the protocol: the spec's ``protocol`` section, built with
    :meth:`from_spec`, plus ``t_guard`` (bonferroni design), the A/A prior
    ``prior_sd`` / ``prior_df`` (sequential design: the per-pair sd of the
    session's A/A and its degrees of freedom, pooled into the pair budget) and
    the session's A/A ``floor`` (sequential design: a keep's lower end must
    clear ``(1 + min_gain)(1 + floor)``, :mod:`inferloom.measure.keep_rule`;
    0 without an A/A and in results written before it).
    :class:`~inferloom.spec.ProtocolSpec` declares every default and bound
    once; direct construction (tests, benchmarks) takes the same defaults and
    is checked against the same bounds. ``min_gain`` reaches the protocol only
    through these settings. ``jit_remeasures``: the pairs a comparison measures
    again because a server JIT-compiled during one of their runs
    (:mod:`inferloom.measure.protocol_remeasure`); results written before it
    have no such key and re-measured nothing."""

    design: str = _spec("design")
    min_gain: float = _spec("min_gain")
    confidence: float = _spec("confidence")
    min_pairs: int = _spec("min_pairs")
    max_pairs: int = _spec("max_pairs")
    pair_step: int = _spec("pair_step")
    target_gain: float = _spec("target_gain")
    power: float = _spec("power")
    futility_error: float = _spec("futility_error")
    trim: float = _spec("trim")
    harm_ratio: float = _spec("harm_ratio")
    spending_power: float = _spec("spending_power")
    jit_remeasures: int = _spec("jit_remeasures")
    warmup_runs: int = _spec("warmup_runs")
    bootstrap_resamples: int = _spec("bootstrap_resamples")
    bootstrap_seed: int = _spec("bootstrap_seed")
    t_guard: bool = True  # bonferroni design: also require the Student-t interval to clear g; not a spec key
    prior_sd: float | None = None  # sequential design: the A/A's per-pair sd; not a spec key
    prior_df: int = 0
    floor: float = 0.0  # sequential design: the session A/A's floor (keep_rule.aa_floor); not a spec key

    def __post_init__(self) -> None:
        spec_keys = ProtocolSpec.model_fields
        check_bounds(ProtocolSpec, {k: v for k, v in asdict(self).items() if k in spec_keys}, "protocol")
        if self.prior_sd is not None and not (self.prior_sd >= 0.0 and self.prior_df >= 1):
            raise ValueError(f"protocol prior_sd: expected a sd >= 0 with prior_df >= 1, got "
                             f"{self.prior_sd!r} with prior_df {self.prior_df!r}")
        if not (isinstance(self.floor, (int, float)) and 0.0 <= self.floor < float("inf")):
            raise ValueError(f"protocol floor: expected the A/A floor as a finite gain >= 0, got {self.floor!r}; "
                             "it comes from the session's A/A (keep_rule.aa_floor)")

    @classmethod
    def from_spec(cls, spec: ProtocolSpec) -> "ProtocolSettings":
        return cls(**spec.model_dump())

    @property
    def alpha(self) -> float:
        """The keep's error: one side of the two-sided ``confidence``."""
        return (1.0 - self.confidence) / 2.0

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
    ``ci_low`` / ``ci_high`` is the interval the verdict used. Bonferroni
    design: the bootstrap interval (its union with the t interval when
    guarded); ``method`` is the bootstrap method, suffixed ``+t`` when guarded.
    Sequential design (``design == "sequential"``): ``mean_log`` is the trimmed
    mean, the interval ``mean_log +- crit_keep * se_log``, ``method``
    ``"trimmed-t"``; ``stop`` says why the run stopped (``efficacy``,
    ``futility``, ``below_min_gain``, ``budget``, ``harm``; None while it continues) and
    ``reason`` says it in words; the bootstrap fields are None; ``floor`` is
    the session A/A's floor the keep cleared on top of ``min_gain`` (0.0 when
    none, and in results written before it). A harm stop (``stop == "harm"``, ``method`` ``"harm"``, before
    the first planned look: :func:`inferloom.measure.sequential.harm_look`) has ``ci_low`` / ``ci_high`` the
    smallest and largest pair ratio (no interval), ``harm_bound`` the ratio every pair was below and
    ``harm_sd`` the per-pair sd the bound used; both None for every other look."""

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
    bootstrap_seed: int | None
    resamples: int | None
    min_gain: float
    boot_ci_low: float | None
    boot_ci_high: float | None
    t_ci_low: float | None  # None when the t guard is off (or the design is sequential)
    t_ci_high: float | None
    design: str = "bonferroni"
    stop: str | None = None
    reason: str | None = None
    se_log: float | None = None
    df: int | None = None
    budget: int | None = None
    sigma_budget: float | None = None
    info_fraction: float | None = None
    alpha_spent: float | None = None
    beta_spent: float | None = None
    crit_keep_z: float | None = None
    crit_keep: float | None = None
    crit_futility: float | None = None
    futility_high: float | None = None
    futility_gain: float | None = None
    target_gain: float | None = None
    floor: float = 0.0
    harm_bound: float | None = None
    harm_sd: float | None = None

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
