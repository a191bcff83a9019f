"""What ``inferloom verify`` found: one :class:`Check` per number, collected by a :class:`Findings`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inferloom.errors import InferloomError

__all__ = ["VerifyError", "Check", "Findings"]


class VerifyError(InferloomError, ValueError):
    """The directory is not a session ``verify`` can read (no ledger, a corrupt file, a payload of the wrong
    shape): one line, exit 2."""


@dataclass(frozen=True)
class Check:
    """One number: its group (the table's row), its name, the value the session recorded, the value
    re-derived from the raw ledger records, the ledger seq it comes from, and how it was compared."""

    group: str
    name: str
    recorded: Any
    recomputed: Any
    seq: int | None
    ok: bool
    how: str = "exact"


@dataclass
class Findings:
    """Every check made, in order."""

    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, group: str, name: str, recorded: Any, recomputed: Any, seq: int | None, ok: bool,
            how: str = "exact") -> bool:
        self.checks.append(Check(group, name, recorded, recomputed, seq, bool(ok), how))
        return bool(ok)

    @property
    def mismatches(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def summary(self) -> list[tuple[str, int, int, str]]:
        """Per group, in first-seen order: (group, numbers checked, mismatches, how they were compared)."""
        rows: dict[str, list[Any]] = {}
        for c in self.checks:
            row = rows.setdefault(c.group, [0, 0, set()])
            row[0] += 1
            row[1] += 0 if c.ok else 1
            row[2].add(c.how)
        return [(g, n, bad, ", ".join(sorted(hows))) for g, (n, bad, hows) in rows.items()]
