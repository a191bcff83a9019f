"""Small helpers every session step shares: idempotency keys, seed blocks,
JSON-safe values for the ledger, the objective's median, what agents see."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from inferloom.session.state import SessionState

__all__ = ["step_key", "seed_base", "jsonable", "agent_view"]


def step_key(*parts: Any) -> str:
    """A stable ledger idempotency key for one step, from what identifies it."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def seed_base(seed: int, n: int) -> int:
    """Fresh prompts for every measurement: a distinct block of seeds per step
    ``n``, derived from the spec's seed (reproducible, stable across resume)."""
    return 1_000 + 1_000 * (n + 1) + (int(seed) % 997) * 1_000_000


def jsonable(x: Any) -> Any:
    """``x`` if it is strict JSON (finite floats), else its repr (an agent's
    malformed output still reaches the ledger, as text)."""
    try:
        json.dumps(x, allow_nan=False)
        return x
    except (TypeError, ValueError):
        return repr(x)[:2000]


def agent_view(st: SessionState) -> dict[str, Any]:
    """What agents see: the state as written to disk, plus derived keys."""
    d = st.to_dict()
    d["started_at"] = st.created_at
    x = st.extra
    d["proposals"] = list(x.proposals or [])
    d["kb_failures"] = list(x.kb_failures or [])
    d["cycle_started_at"] = x.cycle_started_at if x.cycle_started_at is not None else st.created_at
    return d
