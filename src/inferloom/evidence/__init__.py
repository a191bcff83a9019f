"""Evidence another team can check: a person's promotion of a session's winner
(:mod:`inferloom.evidence.promote`), the export archive with its SHA256SUMS
(:mod:`inferloom.evidence.archive`) and the re-measurement of a final stack
(:mod:`inferloom.evidence.remeasure`). The independent re-derivation of the
numbers is :mod:`inferloom.verify`, which imports nothing from here."""

__all__: list[str] = []
