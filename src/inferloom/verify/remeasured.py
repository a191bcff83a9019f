"""The pairs a measurement measured again because a server JIT-compiled during one of their runs (the
protocol's contract, "A compile is warm-up"), written again from the rule: a voided pair has a kernel in
``server_jit`` on run A or B; a measurement voids at most ``settings.jit_remeasures`` of them (a result without
the key voids none); a counted pair with a compile comes after the bound was used (the rule voids the first
ones, never chosen); each re-measured slot ran again in its own order on the fresh seeds
``seed_base + max_pairs + k - 1`` after its ``k``-th voided pair. The decision itself is re-derived from
``pairs`` alone (:mod:`inferloom.verify.measurements`), the voided ones in no look. A result written before
the rule (no ``remeasured`` key, no ``jit_remeasures`` setting) gets no check from here: it verifies as it did.
"""

from __future__ import annotations

from typing import Any, Mapping

from inferloom.verify.record import Findings

__all__ = ["check_remeasured"]

RULE = "re-measure rule"


def _jit(p: Mapping[str, Any]) -> list[str]:
    out = []
    for arm, key in (("A", "a"), ("B", "b")):
        ks = ((p.get(key) or {}).get("extra") or {}).get("server_jit")
        if ks:
            out.append(f"{arm} {', '.join(map(str, ks))}")
    return out


def check_remeasured(f: Findings, proto: Mapping[str, Any], seq: int) -> None:
    """Every re-measured pair of one measurement's protocol result, and every counted pair with a compile."""
    st = proto.get("settings") or {}
    if "remeasured" not in proto and "jit_remeasures" not in st:
        return
    bound = int(st.get("jit_remeasures") or 0)
    again = list(proto.get("remeasured") or [])
    pairs = list(proto.get("pairs") or [])
    f.add("pairs", "pairs measured again (a server JIT compile)", len(again),
          f"at most protocol.jit_remeasures = {bound}", seq, len(again) <= bound, RULE)
    for k, p in enumerate(again, 1):
        name = f"re-measured pair {k} (pair {int(p.get('index', -1)) + 1}, seed {p.get('seed')})"
        said = _jit(p)
        f.add("pairs", f"{name}: a server JIT compile in a run's record", said or "no server_jit on run A or B",
              "a kernel in server_jit on run A or B", seq, bool(said), RULE)
        f.add("pairs", f"{name}: its number", p.get("remeasure"), k, seq, p.get("remeasure") == k, RULE)
    for p in pairs:
        said = _jit(p)
        if said:
            used = sum(1 for q in again if int(q.get("index", -1)) <= int(p.get("index", -1)))
            f.add("pairs", f"pair {int(p.get('index', -1)) + 1} (seed {p.get('seed')}) counted with a server JIT "
                  f"compile ({'; '.join(said)})", f"{used} re-measure(s) before it",
                  f"all {bound} used before it", seq, used >= bound, RULE)
    base, top = int(proto.get("seed_base", 0)), int(st.get("max_pairs", 0))
    for i in sorted({int(p.get("index", -1)) for p in again}):
        slot = [(k, p) for k, p in enumerate(again, 1) if int(p.get("index", -1)) == i]
        slot += [(0, p) for p in pairs if int(p.get("index", -1)) == i]
        want = [base + i] + [base + top + k - 1 for k, _ in slot if k]
        order = "AB" if i % 2 == 0 else "BA"
        got = [(p.get("seed"), p.get("order")) for _, p in slot]
        exp = [(s, order) for s in want[:len(slot)]]
        f.add("pairs", f"pair {i + 1} measured again: each attempt's seed and order", got, exp, seq, got == exp, RULE)
