"""Relaxed lookup: the closest recipe with a winning configuration, and how close.

Tiers, tried in order; each keeps every field of the tier before it relaxed
and relaxes one more (cumulative), and only matches recipes whose newly
relaxed field differs from the key (so each tier shows recipes the tiers
above it could not see):

====  =========================  ===========================================  ==========
tier  name                       fields relaxed (any value accepted)          confidence
====  =========================  ===========================================  ==========
0     exact                      none                                         1.0
1     framework_version          framework_version                            0.9
2     hardware                   + hardware                                   0.7
3     model                      + model                                      0.5
4     architecture               + architecture                               0.35
5     model_type                 + model_type                                 0.2
====  =========================  ===========================================  ==========

``precision`` is never relaxed (another precision is another quality
contract), nor is ``framework`` (a configuration's knobs are its framework's
own). Within a tier the best recipe is the non-drifted one with the highest
measured ratio (then the most recently updated), except that a recipe whose
winner a person promoted (``inferloom promote``) comes first. A recipe marked ``drift``
counts at half its tier's confidence (:data:`DRIFT_FACTOR`).

The chosen recipe is the highest-confidence match at or above
``min_confidence`` (the earlier tier on a tie). Tiers stop being tried once no
later tier could beat the choice, or their confidence is below
``min_confidence``; those are listed as not tried. Past
failures come back as priors (change-sets with their rule and the confidence
of the recipe they come from) from the exact-key recipe (even one without a
winner) and from the chosen one: evidence to rank proposals down, not bans.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select

from inferloom.kb.db import INDEX_ORDER, recipes
from inferloom.kb.key import WorkloadKey
from inferloom.kb.recipe import Recipe
from inferloom.kb.rows import row_to_recipe

__all__ = ["Tier", "TIERS", "DRIFT_FACTOR", "NEVER_RELAXED", "TierResult", "LookupResult", "lookup", "format_lookup"]

DRIFT_FACTOR = 0.5
NEVER_RELAXED = ("precision", "framework")
_CANDIDATE_CAP = 100


@dataclass(frozen=True)
class Tier:
    index: int
    name: str
    relaxed: tuple[str, ...]
    confidence: float


_CONF = (1.0, 0.9, 0.7, 0.5, 0.35, 0.2)
TIERS: tuple[Tier, ...] = tuple(
    Tier(t, "exact" if t == 0 else INDEX_ORDER[len(INDEX_ORDER) - t],
         tuple(INDEX_ORDER[len(INDEX_ORDER) - t:][::-1]), _CONF[t]) for t in range(6)
)
assert [t.name for t in TIERS] == ["exact", "framework_version", "hardware", "model", "architecture", "model_type"]
assert not set(NEVER_RELAXED) & set(TIERS[-1].relaxed)


@dataclass
class TierResult:
    tier: Tier
    tried: bool
    matched: Recipe | None = None     # the tier's best recipe with a winner
    confidence: float | None = None   # the match's confidence (tier's, halved if drift)
    candidates: int = 0               # recipes with a winner in this tier (capped at 100)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"tier": self.tier.index, "name": self.tier.name, "relaxed": list(self.tier.relaxed),
                "tier_confidence": self.tier.confidence, "tried": self.tried,
                "matched_id": self.matched.id if self.matched else None,
                "matched_key": self.matched.key.to_dict() if self.matched else None,
                "matched_status": self.matched.status if self.matched else None,
                "matched_ratio": self.matched.winner["ratio"] if self.matched and self.matched.winner else None,
                "matched_promoted_by": ((self.matched.winner or {}).get("promotion") or {}).get("by")
                if self.matched else None,
                "confidence": self.confidence, "candidates": self.candidates, "note": self.note}


@dataclass
class LookupResult:
    key: WorkloadKey
    min_confidence: float
    tiers: list[TierResult]
    chosen: Recipe | None = None
    confidence: float = 0.0
    chosen_tier: int | None = None
    exact: Recipe | None = None                       # the exact-key recipe, winner or not
    priors: list[dict[str, Any]] = field(default_factory=list)
    lessons: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key.to_dict(), "min_confidence": self.min_confidence,
                "tiers": [t.to_dict() for t in self.tiers], "chosen_tier": self.chosen_tier,
                "confidence": self.confidence, "chosen": self.chosen.to_dict() if self.chosen else None,
                "priors": self.priors, "lessons": self.lessons}


def _tier_query(key: WorkloadKey, tier: Tier) -> Any:
    n_fixed = len(INDEX_ORDER) - tier.index
    where = [recipes.c[f] == getattr(key, f) for f in INDEX_ORDER[:n_fixed]]
    if tier.index:
        newly = INDEX_ORDER[n_fixed]
        where.append(recipes.c[newly] != getattr(key, newly))
    where.append(recipes.c.ratio.is_not(None))
    return where


def lookup(store: Any, key: WorkloadKey, min_confidence: float = 0.0) -> LookupResult:
    """Find the closest recipe for ``key`` in ``store`` (a RecipeStore); see the module doc."""
    res = LookupResult(key=key, min_confidence=float(min_confidence), tiers=[])
    best_conf = 0.0
    with store.db.read() as conn:
        exact_row = conn.execute(select(recipes).where(*[recipes.c[f] == getattr(key, f) for f in INDEX_ORDER])).first()
        res.exact = row_to_recipe(exact_row) if exact_row is not None else None
        for tier in TIERS:
            if res.chosen is not None and tier.confidence <= best_conf:
                res.tiers.append(TierResult(tier, False, note="not tried: a closer tier already matched"))
                continue
            if tier.confidence < min_confidence:
                res.tiers.append(TierResult(tier, False, note=f"not tried: below min_confidence {min_confidence:g}"))
                continue
            where = _tier_query(key, tier)
            if tier.index == 0:
                rec = res.exact if res.exact is not None and res.exact.winner is not None else None
                n = 1 if rec else 0
            else:
                row = conn.execute(select(recipes).where(*where).order_by(
                    recipes.c.promoted_at.is_(None), recipes.c.status.desc(), recipes.c.ratio.desc(), recipes.c.updated_at.desc(), recipes.c.id)
                    .limit(1)).first()
                rec = row_to_recipe(row) if row is not None else None
                n = 0 if rec is None else conn.execute(select(func.count()).select_from(
                    select(recipes.c.id).where(*where).limit(_CANDIDATE_CAP).subquery())).scalar_one()
            tr = TierResult(tier, True, candidates=n)
            if rec is None:
                tr.note = "no recipe with a winning configuration"
                if tier.index == 0 and res.exact is not None:
                    tr.note = "recipe exists but has no winning configuration (lessons and failures only)"
            else:
                conf = tier.confidence * (DRIFT_FACTOR if rec.status == "drift" else 1.0)
                tr.matched, tr.confidence = rec, conf
                promo = rec.winner.get("promotion") or {}
                tr.note = f"x{rec.winner['ratio']:.3f} from session {rec.winner['session_id']}" + (
                    f"; promoted by {promo['by']}" if promo.get("by") else "") + (
                    f"; marked drift: {rec.drift_note}" if rec.status == "drift" else "")
                if conf < min_confidence:
                    tr.note += f"; below min_confidence {min_confidence:g}"
                elif conf > best_conf:
                    res.chosen, res.confidence, res.chosen_tier, best_conf = rec, conf, tier.index, conf
            res.tiers.append(tr)
    _priors(res)
    return res


def _priors(res: LookupResult) -> None:
    sources: list[tuple[Recipe, float]] = []
    if res.exact is not None:
        sources.append((res.exact, 1.0))
    if res.chosen is not None and (res.exact is None or res.chosen.id != res.exact.id):
        sources.append((res.chosen, res.confidence))
    seen: set[str] = set()
    for rec, conf in sources:
        for f in rec.failed:
            ident = repr((sorted(f.get("changes", {}).items(), key=str), f.get("rule")))
            if ident in seen:
                continue
            seen.add(ident)
            res.priors.append({**f, "confidence": conf, "source_recipe_id": rec.id, "source_key": rec.key.to_dict()})
        res.lessons += [{**les, "confidence": conf, "source_recipe_id": rec.id} for les in rec.lessons]


def format_lookup(res: LookupResult) -> str:
    """Human-readable lines for ``inferloom kb lookup``: the key, every tier, the choice, the priors."""
    lines = [f"key: {res.key}", f"min confidence: {res.min_confidence:g}"]
    for t in res.tiers:
        relaxed = ", ".join(t.tier.relaxed) or "-"
        head = f"  tier {t.tier.index} {t.tier.name:<17} (relaxed: {relaxed}; confidence {t.tier.confidence:g}): "
        if not t.tried:
            lines.append(head + t.note)
        elif t.matched is None:
            lines.append(head + t.note)
        else:
            lines.append(head + f"recipe #{t.matched.id} [{t.matched.key}] confidence {t.confidence:g}, "
                         f"{t.candidates if t.candidates < _CANDIDATE_CAP else f'{_CANDIDATE_CAP}+'} candidate(s); {t.note}")
    if res.chosen is None:
        lines.append("chosen: none (start from stock)")
    else:
        w = res.chosen.winner or {}
        promo = w.get("promotion") or {}
        lines.append(f"chosen: recipe #{res.chosen.id} from tier {res.chosen_tier}, confidence {res.confidence:g}: "
                     f"changes {w.get('changes')} x{w.get('ratio'):.3f} [{w.get('ci_low'):.3f}, {w.get('ci_high'):.3f}]"
                     + (f"; promoted by {promo['by']}" if promo.get("by") else ""))
    for p in res.priors:
        lines.append(f"  prior (confidence {p['confidence']:g}): {p.get('changes')} failed by rule "
                     f"'{p.get('rule')}': {p.get('lesson') or ''}")
    return "\n".join(lines)
