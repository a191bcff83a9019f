"""Helpers for the energy tests: a real session's ledger entries with the GPU energy readings a metered
machine would write into its timed runs (this CPU machine has no meter), and `inferloom verify` over them."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

from inferloom.session import ledger as L
from inferloom.verify import verify_session


def with_energy(entries: list[dict[str, Any]], j_per_s: float = 300.0, offset_j: float = 0.0,
                bump: tuple[int, float] | None = None) -> list[dict[str, Any]]:
    """A copy of the session's entries with a reading in every successful timed run (as a metered machine
    writes them: ``j_per_s`` x the run's wall time + ``offset_j`` joules); ``bump`` = (seq, factor) scales
    that measurement's first pair's readings."""
    out = copy.deepcopy(entries)
    for m in out:
        if m["kind"] != L.MEASUREMENT or not m.get("protocol"):
            continue
        for i, p in enumerate(m["protocol"]["pairs"]):
            for arm in "ab":
                r = p[arm]
                if r.get("success"):
                    j = (j_per_s * r["wall_s"] + offset_j) * (bump[1] if bump and bump[0] == m["seq"] and i == 0 else 1.0)
                    r.setdefault("extra", {}).update(gpu_energy_j=j, energy_method="nvml_energy_counter")
    return out


def verify_with(session: Path, dest: Path, entries: list[dict[str, Any]], breakdown: dict[str, Any]) -> Any:
    """``inferloom verify`` of a copy of ``session`` at ``dest`` whose ledger is ``entries`` and whose
    breakdown is ``breakdown`` (a session directory that carries the readings)."""
    shutil.copytree(session, dest)
    (dest / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    (dest / "session_breakdown.json").write_text(json.dumps(breakdown))
    return verify_session(dest)
