"""The report's energy numbers re-derived from the raw run records: each measurement's joules per output
token and output tokens per second, per arm, for the GPUs (``extra.gpu_energy_j``, NVML) and the CPU
packages (``extra.cpu_energy_j``, RAPL), against ``session_breakdown.json``'s ``platform`` block
(``energy_by_measurement`` and the CLOSE comparison's ``energy``). A measurement whose runs carry readings
but is not listed, or a listed one whose runs carry none, is a mismatch too. Independent code: nothing of
the report's is imported."""

from __future__ import annotations

import math
from typing import Any, Mapping

from inferloom.verify.record import Findings

__all__ = ["check_energy"]

GROUP = "energy per token"
_KEYS = (("gpu", "gpu_energy_j"), ("cpu", "cpu_energy_j"))


def _arm(m: Mapping[str, Any], arm: str, key: str) -> dict[str, float] | None:
    j = tok = wall = 0.0
    n = 0
    for p in (m.get("protocol") or {}).get("pairs") or []:
        r = p.get(arm) or {}
        v = (r.get("extra") or {}).get(key)
        if not r.get("success") or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        j, tok, wall, n = j + v, tok + (r.get("output_tokens") or 0), wall + (r.get("wall_s") or 0.0), n + 1
    if n == 0:
        return None
    return {"j_per_output_token": j / tok if tok else None, "output_tokens_per_s": tok / wall if wall else None,
            "energy_j": j, "runs": n}


def _close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return isinstance(a, (int, float)) and math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)


def _arms(f: Findings, what: str, row: Mapping[str, Any], names: tuple[str, str],
          want: tuple[dict[str, float], dict[str, float]], seq: int) -> None:
    for name, w in zip(names, want):
        got = row.get(name) or {}
        for key in ("j_per_output_token", "output_tokens_per_s", "energy_j", "runs"):
            f.add(GROUP, f"{what} {name}.{key}", got.get(key), w[key], seq, _close(got.get(key), w[key]))


def check_energy(f: Findings, entries: list[dict[str, Any]], bd: Mapping[str, Any] | None) -> None:
    plat = (bd or {}).get("platform")
    if not isinstance(plat, Mapping):
        return
    rows = {(r.get("ledger_seq"), r.get("source")): r for r in plat.get("energy_by_measurement") or []}
    seen = set()
    for m in (e for e in entries if e["kind"] == "measurement" and e.get("protocol")):
        what = f"trial {m['trial']}" if m.get("trial") is not None else str(m.get("action"))
        for source, key in _KEYS:
            a, b = _arm(m, "a", key), _arm(m, "b", key)
            row = rows.get((m["seq"], source))
            if a is None or b is None:
                if row is not None:
                    f.add(GROUP, f"{what} {source} listed", True, False, m["seq"], False,
                          "listed, but its runs carry no readings")
                    seen.add((m["seq"], source))
                continue
            seen.add((m["seq"], source))
            if f.add(GROUP, f"{what} {source} listed", row is not None, True, m["seq"], row is not None):
                _arms(f, f"{what} {source}", row, ("base", "candidate"), (a, b), m["seq"])
        if m.get("action") == "final_compare" and plat.get("energy") is not None:
            a, b = _arm(m, "a", "gpu_energy_j"), _arm(m, "b", "gpu_energy_j")
            if a is not None and b is not None:
                _arms(f, "CLOSE gpu", plat["energy"], ("stock", "final"), (a, b), m["seq"])
    for k in set(rows) - seen:
        f.add(GROUP, f"ledger #{k[0]} {k[1]} listed", True, False, k[0], False, "no such measurement in the ledger")
