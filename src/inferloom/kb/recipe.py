"""What a recipe holds, and the strict rules for what may enter it (pure functions).

A winning configuration enters only from a session whose breakdown
(``session_breakdown.json``, derived from its ledger) has a paired final
comparison of the final stack against stock (``final.ledger_seq`` and
``n_pairs`` present) whose protocol verdict is ``keep``, whose held-out
quality passed (``quality_passed is True``), with a finite ratio and interval,
and a recorded final configuration that differs from stock
(:func:`winner_from_breakdown`). Tables the final stack's engine overlays carried (vLLM's tuned fused-MoE
configs: the breakdown's ``final_engine_tables``) go with the winner as ``evidence.engine_tables``, their
content (a later session's warm replay writes them out again). Anything else is a session without a winner:
its lessons and failures are still recorded.

Between two valid winners the better is the one with the higher rank
``(status == 'ok', promoted, ratio)``: a higher measured ratio replaces a lower one, a
winner a person promoted (``inferloom promote``: ``winner["promotion"]``) is replaced
only by another promoted one, and a winner marked ``drift`` (it did not reproduce)
is replaced by any valid winner that is not drifted. inferloom never promotes on its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from inferloom.kb.db import dumps
from inferloom.kb.key import WorkloadKey

__all__ = ["Recipe", "winner_from_breakdown", "valid_winner", "better", "failures_from_breakdown",
           "lessons_from_breakdown", "worked_from_breakdown", "promoted", "normalize_failures", "normalize_lessons",
           "union", "FAILED_CAP", "LESSONS_CAP", "WORKED_CAP"]

FAILED_CAP = 500   # newest kept per recipe
LESSONS_CAP = 500
WORKED_CAP = 500


@dataclass
class Recipe:
    """One row of the KB: a workload key and what sessions learned about it."""

    key: WorkloadKey
    status: str = "ok"                       # 'ok' | 'drift'
    winner: dict[str, Any] | None = None     # config, changes, ratio, ci_low, ci_high, objectives, session_id, ...
    sessions: list[dict[str, Any]] = field(default_factory=list)
    worked: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    lessons: list[dict[str, Any]] = field(default_factory=list)
    drift_note: str | None = None
    drift_at: float | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    id: int | None = None

    @property
    def session_ids(self) -> list[str]:
        """The sessions recorded on this recipe, oldest first."""
        return [s["session_id"] for s in self.sessions if s.get("kind", "session") == "session"]

    def to_dict(self, with_id: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id} if with_id else {}
        d.update({"key": self.key.to_dict(), "status": self.status, "winner": self.winner,
                  "sessions": self.sessions, "worked": self.worked, "failed": self.failed,
                  "lessons": self.lessons, "drift_note": self.drift_note, "drift_at": self.drift_at,
                  "created_at": self.created_at, "updated_at": self.updated_at})
        return d


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(float(x)):
        return None
    return float(x)


def changes_from(config: Mapping[str, Any], stock: Mapping[str, Any] | None) -> dict[str, Any]:
    stock = stock or {}
    return {k: v for k, v in config.items() if k not in stock or stock[k] != v}


def winner_from_breakdown(b: Mapping[str, Any], session_id: str, now: float) -> tuple[dict[str, Any] | None, str, str]:
    """``(winner, code, why)``: the winner a session may enter, or None with the
    rule it failed (``code``) and a one-line reason."""
    f = b.get("final") if isinstance(b.get("final"), Mapping) else {}
    if f.get("ledger_seq") is None:
        return None, "no-final-comparison", "no paired final comparison against stock (nothing kept, or the session did not close)"
    verdict = f.get("protocol_verdict")
    if verdict != "keep":
        return None, f"final-{verdict}", f"final stack vs stock: protocol verdict {verdict!r}, not 'keep'"
    q = f.get("quality_passed")
    if q is not True:
        code = "final-quality-failed" if q is False else "final-quality-unscored"
        return None, code, "held-out quality " + ("failed" if q is False else "was not evaluated")
    ratio, lo, hi = _num(f.get("ratio")), _num(f.get("ci_low")), _num(f.get("ci_high"))
    n_pairs = f.get("n_pairs")
    if ratio is None or lo is None or hi is None or not isinstance(n_pairs, int) or n_pairs < 1:
        return None, "final-incomplete", "final comparison lacks a finite ratio, interval or pair count"
    config = b.get("final_config")
    if not isinstance(config, Mapping):
        return None, "no-final-config", "no final configuration recorded (the session did not close)"
    changes = changes_from(config, b.get("stock_config"))
    if not changes:
        return None, "final-equals-stock", "the final stack is stock"
    winner = {
        "config": dict(config), "changes": changes, "ratio": ratio, "ci_low": lo, "ci_high": hi,
        "stock_objective": _num(f.get("stock_median_same_run")), "final_objective": _num(f.get("objective_median")),
        "n_pairs": n_pairs, "session_id": session_id, "recorded_at": now,
        "evidence": {"protocol_verdict": verdict, "quality_passed": True, "paired": True,
                     "ledger_seq": f.get("ledger_seq"), "quality_failed": f.get("quality_failed") or [],
                     "stop_reason": b.get("stop_reason")},
    }
    if isinstance(b.get("final_engine_tables"), Mapping) and b["final_engine_tables"]:
        winner["evidence"]["engine_tables"] = dict(b["final_engine_tables"])  # the content, not a path
    return winner, "keep", "paired final comparison kept, held-out quality passed"


def valid_winner(w: Any) -> bool:
    """The strict rule again, on a stored or imported winner."""
    if not isinstance(w, Mapping):
        return False
    ev = w.get("evidence") if isinstance(w.get("evidence"), Mapping) else {}
    return (ev.get("protocol_verdict") == "keep" and ev.get("quality_passed") is True
            and all(_num(w.get(k)) is not None for k in ("ratio", "ci_low", "ci_high"))
            and isinstance(w.get("config"), Mapping) and bool(w.get("changes"))
            and isinstance(w.get("session_id"), str) and bool(w.get("session_id")))


def better(new: Mapping[str, Any] | None, new_status: str, old: Mapping[str, Any] | None, old_status: str) -> bool:
    """Whether ``new`` should replace ``old`` as the recipe's winner."""
    if new is None:
        return False
    if old is None:
        return True
    return ((new_status == "ok", promoted(new), float(new["ratio"]))
            > (old_status == "ok", promoted(old), float(old["ratio"])))


def promoted(w: Mapping[str, Any] | None) -> bool:
    """Whether a person promoted this winner (``inferloom promote``)."""
    return bool(w) and isinstance(w.get("promotion"), Mapping) and bool(w["promotion"].get("by"))  # type: ignore[union-attr]


def normalize_failures(items: Any, session_id: str, now: float) -> list[dict[str, Any]]:
    """Failures as ``{changes, rule, outcome, ratio, ci_low, ci_high, lesson, trial, session_id, at}``."""
    out = []
    for it in items or []:
        if not isinstance(it, Mapping):
            raise ValueError(f"failure {it!r}: expected a mapping with 'changes' and 'rule'")
        rule = it.get("rule") or it.get("outcome")
        if not rule:
            raise ValueError(f"failure {dict(it)!r}: needs a 'rule' (or 'outcome')")
        out.append({"changes": dict(it.get("changes") or {}), "rule": str(rule),
                    "outcome": it.get("outcome", rule), "ratio": _num(it.get("ratio")),
                    "ci_low": _num(it.get("ci_low")), "ci_high": _num(it.get("ci_high")),
                    "lesson": it.get("lesson") or it.get("why"), "trial": it.get("trial"),
                    "session_id": it.get("session_id") or session_id, "at": it.get("at") or now})
    return out


def failures_from_breakdown(b: Mapping[str, Any], session_id: str, now: float,
                            final_code: str | None = None, final_why: str | None = None) -> list[dict[str, Any]]:
    """Rejected trials (rule = their outcome; not those whose server start the budget cut), refusals (rule =
    the refusal's rule), and the final stack itself when its final comparison ran but failed."""
    items: list[dict[str, Any]] = [dict(r) for r in b.get("rejected") or [] if r.get("error_kind") != "budget"]
    items += [{"changes": {}, "rule": r.get("rule"), "outcome": "refused", "why": r.get("why")}
              for r in b.get("refusals") or []]
    f = b.get("final") if isinstance(b.get("final"), Mapping) else {}
    if final_code and final_code != "keep" and f.get("ledger_seq") is not None and isinstance(b.get("final_config"), Mapping):
        items.append({"changes": changes_from(b["final_config"], b.get("stock_config")), "rule": final_code,
                      "outcome": f.get("protocol_verdict"), "ratio": f.get("ratio"), "ci_low": f.get("ci_low"),
                      "ci_high": f.get("ci_high"), "lesson": f"final stack vs stock: {final_why}"})
    return normalize_failures(items, session_id, now)


def normalize_lessons(items: Any, session_id: str, now: float) -> list[dict[str, Any]]:
    out = []
    for it in items or []:
        if isinstance(it, Mapping):
            text, sid = it.get("text"), it.get("session_id") or session_id
        else:
            text, sid = it, session_id
        if text:
            out.append({"text": str(text), "session_id": sid, "at": (it.get("at") if isinstance(it, Mapping) else None) or now})
    return out


def lessons_from_breakdown(b: Mapping[str, Any], session_id: str, now: float, why: str) -> list[dict[str, Any]]:
    texts = [v.get("lesson") for v in (b.get("action_path") or []) + (b.get("rejected") or [])]
    f = b.get("final") if isinstance(b.get("final"), Mapping) else {}
    if _num(f.get("ratio")) is not None and f.get("ledger_seq") is not None:
        texts.append(f"final stack vs stock x{f['ratio']:.3f} [{_num(f.get('ci_low')) or float('nan'):.3f}, "
                     f"{_num(f.get('ci_high')) or float('nan'):.3f}]: {why}")
    else:
        texts.append(f"session result: {why}")
    return normalize_lessons([t for t in texts if t], session_id, now)


def worked_from_breakdown(b: Mapping[str, Any], session_id: str, now: float) -> list[dict[str, Any]]:
    return [{"changes": dict(a.get("changes") or {}), "ratio": _num(a.get("ratio")), "ci_low": _num(a.get("ci_low")),
             "ci_high": _num(a.get("ci_high")), "lesson": a.get("lesson"), "trial": a.get("trial"),
             "session_id": session_id, "at": now} for a in b.get("action_path") or []]


def _ident(kind: str, d: Mapping[str, Any]) -> str:
    if kind == "failed":
        return dumps([d.get("session_id"), d.get("changes"), d.get("rule"), d.get("trial")])
    if kind == "worked":
        return dumps([d.get("session_id"), d.get("changes"), d.get("trial")])
    if kind == "lessons":
        return str(d.get("text"))
    return dumps([d.get("kind", "session"), d.get("session_id"),
                  d.get("at") if d.get("kind") in ("drift", "promotion") else None])


def union(kind: str, old: list[dict[str, Any]], new: list[dict[str, Any]], cap: int | None = None) -> list[dict[str, Any]]:
    """``old`` then the entries of ``new`` not already there (by identity), newest ``cap`` kept."""
    seen = {_ident(kind, d) for d in old}
    out = list(old)
    for d in new:
        i = _ident(kind, d)
        if i not in seen:
            seen.add(i)
            out.append(d)
    return out[-cap:] if cap else out
