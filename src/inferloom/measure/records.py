"""Typed records of a measurement, from :func:`inferloom.measure.compare.compare`
through the Critic and the keep rule to the ledger entry.

:class:`Comparison` is what one paired comparison measured (the protocol's
result, the quality contract's, the timings); :class:`Evidence` is what the
Critic and the keep rule (:func:`inferloom.measure.keep_rule.decide`) judge.
Both are frozen and serialized only at the ledger boundary: ``as_dict()``
gives exactly the dict the ledger has always held, key order included (a
ledger written before these records and one written after are the same bytes).
``from_dict()`` reads one back (a resumed session's measurement, or an entry
that carries more keys than the record: those are ignored).

A caller that wants the dict asks ``as_dict()`` (``{**compare(...).as_dict()}``).
Pure; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

__all__ = ["PairedDecision", "Comparison", "Evidence", "EVIDENCE_KEYS"]


def _m(x: Any) -> Mapping[str, Any]:
    return x if isinstance(x, Mapping) else {}


@dataclass(frozen=True)
class PairedDecision:
    """The protocol's last look, as the keep rule reads it: the ratio B/A, its interval, the pairs it used
    and why it stopped (all None when the protocol never looked: a failed comparison)."""

    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    n_pairs: int | None = None
    reason: str | None = None

    @classmethod
    def from_dict(cls, d: Any) -> "PairedDecision":
        d = _m(d)
        return cls(ratio=d.get("ratio"), ci_low=d.get("ci_low"), ci_high=d.get("ci_high"), n_pairs=d.get("n_pairs"),
                   reason=d.get("reason"))


@dataclass(frozen=True)
class Comparison:
    """One paired comparison (stock or the stack vs a candidate). ``verdict``: the protocol's (``keep``,
    ``revert``, ``inconclusive``, ``failed``); ``protocol``: its result (``ProtocolResult.to_dict()``:
    settings, looks, pairs, decision), None when preparation or warm-up failed (then ``error_kind`` says
    how); ``quality``: the quality contract's result (``{"evaluated": False}`` when not judged); ``noise``:
    an A/A's noise block (``protocol.noise_floor``) when every pair ran; ``timings``: preparation,
    warm-up, compile overhead, timed runs; ``wall_s``: the whole comparison."""

    base_config: dict[str, Any]
    candidate_config: dict[str, Any]
    seed_base: Any
    verdict: str | None
    error: str | None = None
    protocol: dict[str, Any] | None = None
    quality: dict[str, Any] = field(default_factory=lambda: {"evaluated": False})
    timings: dict[str, Any] = field(default_factory=dict)
    wall_s: float | None = None
    noise: dict[str, Any] | None = None
    error_kind: str | None = None

    @property
    def failed_early(self) -> bool:
        """Preparation or warm-up failed: no pair ran."""
        return self.protocol is None

    @property
    def decision(self) -> PairedDecision:
        return PairedDecision.from_dict(_m(self.protocol).get("decision"))

    @property
    def pairs(self) -> list[dict[str, Any]]:
        return list(_m(self.protocol).get("pairs") or [])

    @property
    def quality_passed(self) -> bool | None:
        """The quality contract's verdict: None when it was not evaluated."""
        q = _m(self.quality)
        return q.get("passed") if q.get("evaluated") else None

    @property
    def quality_failed(self) -> list[Any]:
        return list(_m(self.quality).get("failed", []))

    def as_dict(self) -> dict[str, Any]:
        """The ledger's form (key order as compare() has always written it)."""
        out: dict[str, Any] = {"base_config": self.base_config, "candidate_config": self.candidate_config,
                               "seed_base": self.seed_base}
        if self.protocol is None:  # preparation or warm-up failed
            out.update(verdict=self.verdict, error=self.error, error_kind=self.error_kind, quality=self.quality,
                       timings=self.timings)
        else:
            out.update(protocol=self.protocol, verdict=self.verdict, error=self.error)
            if self.noise is not None:
                out["noise"] = self.noise
            out.update(timings=self.timings, quality=self.quality)
        out["wall_s"] = self.wall_s
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Comparison":
        """A comparison read back (a ledger MEASUREMENT entry: its other keys are ignored)."""
        return cls(base_config=dict(_m(d.get("base_config"))), candidate_config=dict(_m(d.get("candidate_config"))),
                   seed_base=d.get("seed_base"), verdict=d.get("verdict"), error=d.get("error"),
                   protocol=d.get("protocol") if isinstance(d.get("protocol"), Mapping) else None,
                   quality=dict(_m(d.get("quality"))) or {"evaluated": False}, timings=dict(_m(d.get("timings"))),
                   wall_s=d.get("wall_s"), noise=d.get("noise"), error_kind=d.get("error_kind"))


#: the evidence's keys in the ledger's order (the critic's AGENT_IO ``input``)
EVIDENCE_KEYS = ("changes", "protocol_verdict", "ratio", "ci_low", "ci_high", "n_pairs", "quality_passed",
                 "quality_failed", "noise_floor", "min_gain", "error", "protocol_reason")


@dataclass(frozen=True)
class Evidence:
    """What the Critic and the keep rule judge for one trial: the changes, the protocol's verdict and last
    look (ratio, interval, pairs, why it stopped), the quality verdict (None: not evaluated) and what
    failed, the session's A/A floor (a gain, :func:`inferloom.measure.keep_rule.aa_floor`), the minimum
    gain, and the comparison's error. Built from evidence handed over as a dict (:meth:`from_dict`),
    nothing is validated: malformed values stay as they are, for the Critic to revert (fail-closed)."""

    changes: Mapping[str, Any] = field(default_factory=dict)
    protocol_verdict: Any = None
    ratio: Any = None
    ci_low: Any = None
    ci_high: Any = None
    n_pairs: Any = None
    quality_passed: Any = None
    quality_failed: Sequence[Any] = ()
    noise_floor: Any = 0.0
    min_gain: Any = None
    error: Any = None
    protocol_reason: Any = None

    @classmethod
    def of(cls, comparison: Comparison, *, changes: Mapping[str, Any], noise_floor: float,
           min_gain: float) -> "Evidence":
        d = comparison.decision
        return cls(changes=changes, protocol_verdict=comparison.verdict, ratio=d.ratio, ci_low=d.ci_low,
                   ci_high=d.ci_high, n_pairs=d.n_pairs, quality_passed=comparison.quality_passed,
                   quality_failed=comparison.quality_failed, noise_floor=noise_floor, min_gain=min_gain,
                   error=comparison.error, protocol_reason=d.reason)

    @classmethod
    def from_dict(cls, d: Any) -> "Evidence":
        """Evidence handed over as a mapping (a missing key: None; not a mapping: all None)."""
        if isinstance(d, Evidence):
            return d
        d = d.as_dict() if isinstance(d, Comparison) else _m(d)
        return cls(**{k: d.get(k) for k in EVIDENCE_KEYS})

    def as_dict(self) -> dict[str, Any]:
        """The ledger's form (the critic's AGENT_IO ``input``), in :data:`EVIDENCE_KEYS` order."""
        return {k: getattr(self, k) for k in EVIDENCE_KEYS}
