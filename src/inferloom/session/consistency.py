"""Do ``state.json`` and ``ledger.jsonl`` tell the same story? Checked before a
session is continued, so that ``resume`` never finishes a session from a
partial history (an emptied or truncated ledger, a state edited to point past
it).

:func:`consistency_problems` is a pure function of the state and the ledger's
entries; it returns the disagreements, one sentence each, empty when they
agree:

* the entries' seqs are 1, 2, ..., n;
* the ledger reaches ``state.last_ledger_seq`` (it is written first, so it may
  run past the state after a crash, never stop short of it);
* every measurement the state cites exists and is of its kind: the stock
  baseline and the A/A noise floor (measurements), each trial's measurement
  and verdict, and the other entries the state cites by seq (the stock
  failure, the warm replay, the profile, the rooflines, the sweep points, the
  rollback drill, the kept commits' verdicts).

:func:`check_consistency` raises :class:`InconsistentSession` (exit 2) with the
first problem, how many more there are, and what to do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from inferloom.errors import InferloomError
from inferloom.session.state import SessionState

__all__ = ["InconsistentSession", "consistency_problems", "check_consistency"]


class InconsistentSession(InferloomError, ValueError):
    """``state.json`` cites ledger entries that ``ledger.jsonl`` does not hold."""


def _citations(st: SessionState) -> Iterator[tuple[str, int | None, str | None]]:
    """(what cites it, the seq, the kind the entry must have or None for any kind)."""
    x = st.extra
    if x.stock_objective is not None:
        yield "the stock baseline (extra.stock_objective)", x.stock_objective.ledger_seq, "measurement"
    if st.noise_floor is not None:
        yield "the A/A noise floor (noise_floor)", st.noise_floor.get("ledger_seq"), "measurement"
    for t in st.trials:
        yield f"trial {t.trial}'s measurement", t.measurement_seq, "measurement"
        yield f"trial {t.trial}'s verdict", t.verdict_seq, "verdict"
        if t.roofline is not None:
            yield f"trial {t.trial}'s roofline", t.roofline.ledger_seq, None
    if x.stock_failure is not None:
        yield "the stock failure (extra.stock_failure)", x.stock_failure.seq, None
    if x.warm_replay is not None:
        yield "the warm replay's lookup", x.warm_replay.lookup_seq, None
        yield "the warm replay's verdict", x.warm_replay.verdict_seq, "verdict"
    if x.profile is not None:
        yield "the stock profile", x.profile.ledger_seq, None
    if x.roofline_stock is not None:
        yield "the stock roofline", x.roofline_stock.ledger_seq, None
    if x.roofline_final is not None:
        yield "the final roofline", x.roofline_final.ledger_seq, None
    for cycle, points in (x.sweep or {}).items():
        for p in points:
            yield f"sweep point {p.point} (cycle {cycle})", p.ledger_seq, None
    if x.rollback_drill is not None:
        yield "the rollback drill", x.rollback_drill.ledger_seq, None
    if x.source is not None:
        for k in x.source.kept:
            yield f"kept commit {k.id}'s verdict", k.verdict_seq, "verdict"


def consistency_problems(st: SessionState, entries: list[dict[str, Any]]) -> list[str]:
    """Where ``st`` and the ledger ``entries`` disagree (see the module docstring); [] when they agree."""
    problems: list[str] = []
    seqs = [e.get("seq") for e in entries]
    if seqs != list(range(1, len(entries) + 1)):
        bad = next(i for i, s in enumerate(seqs, 1) if s != i)
        problems.append(f"the ledger's seqs are not 1..{len(entries)} (entry {bad} has seq {seqs[bad - 1]!r})")
    n = len(entries)
    if st.last_ledger_seq > n:
        problems.append(f"state.json accounts for ledger entries up to #{st.last_ledger_seq} but the ledger "
                        f"holds {n}" + (" (it is empty)" if n == 0 else ""))
    kinds = {e.get("seq"): e.get("kind") for e in entries}
    for what, seq, kind in _citations(st):
        if seq is None:
            continue
        if seq not in kinds:
            problems.append(f"{what} cites ledger #{seq}, which the ledger does not hold")
        elif kind is not None and kinds[seq] != kind:
            problems.append(f"{what} cites ledger #{seq}, a {kinds[seq]!r} entry, not a {kind!r}")
    return problems


def check_consistency(directory: str | Path, st: SessionState, entries: list[dict[str, Any]]) -> None:
    """Raise :class:`InconsistentSession` when :func:`consistency_problems` finds any."""
    problems = consistency_problems(st, entries)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InconsistentSession(
            f"{directory}: state.json and ledger.jsonl disagree: {problems[0]}{more}; continuing would finish the "
            "session from a partial history, so nothing was run: restore ledger.jsonl (and state.json) from a "
            "backup, or start a new session")
