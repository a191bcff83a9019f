"""The KERNEL phase's shared steps (``phases/kernel.py`` for the backend's
candidates, ``phases/kernel_llm.py`` for the LLM kernel author's): how a
candidate was decided, the profiled share its op spends, and its paired
end-to-end trial with the Amdahl check (a measured gain larger than Amdahl's
law allows from the op's share and its microbenchmark speed-up is refused,
``amdahl_suspect``, and measured once more; only that second measurement can
keep it)."""

from __future__ import annotations

from typing import Any

from inferloom.kernels.base import KernelCandidate
from inferloom.measure.records import Evidence
from inferloom.phases.common import jsonable as _jsonable
from inferloom.phases.context import SessionContext
from inferloom.phases.trial import Guard, begin, execute_trial, run_trial
from inferloom.session.state import SessionState
from inferloom.session.state_models import KernelProgress, KernelTarget

__all__ = ["KERNEL_CLAIM", "KERNEL_GATE", "AMDAHL_TOLERANCE", "decided", "share", "kernel_trial"]

KERNEL_CLAIM = "kernel_claim"
KERNEL_GATE = "kernel_gate"
AMDAHL_TOLERANCE = 0.05


def decided(st: SessionState) -> dict[str, str]:
    """Candidate id -> how it was decided, for the whole session (created by its first reader)."""
    if st.extra.kernel_decided is None:
        st.extra.kernel_decided = {}
    return st.extra.kernel_decided


def share(targets: list[KernelTarget], cand: KernelCandidate) -> tuple[float | None, str]:
    """The profiled share the candidate's op spends: its target's plus the
    categories it also covers (``KernelCandidate.covers``); None when the
    target is not in the profile (or not profiled: a negative share, the backend's fixed order)."""
    shares = {t.category: float(t.share) for t in targets if float(t.share) >= 0}
    if cand.target not in shares:
        return None, ""
    cats = [cand.target] + [k for k in cand.covers if k in shares and k != cand.target]
    return sum(shares[k] for k in cats), " + ".join(cats)


def _guard(bound: float | None) -> Guard:
    def check(ev: Evidence) -> tuple[str, str] | None:
        r = ev.ratio
        if bound is None or r is None or r <= bound * (1 + AMDAHL_TOLERANCE):
            return None
        return ("amdahl_suspect", f"measured x{r:.3f} end to end, more than the x{bound:.3f} Amdahl's law allows "
                f"from the op's time share and its microbenchmark speed-up: measuring it once more")
    return check


def kernel_trial(ctx: SessionContext, st: SessionState, ks: KernelProgress, proposal: dict[str, Any], key: str,
                 first: bool = False) -> None:
    """Measure a candidate (``first``: its proposal entry and pending action first);
    an Amdahl-suspect result is measured once more."""
    agent = str(proposal.get("source") or f"kernel:{ks.backend}")  # the backend's, or the LLM kernel author's
    remeasure = bool(proposal.get("remeasure"))
    guard = None if remeasure else _guard(proposal.get("amdahl_bound"))
    t = (run_trial(ctx, st, proposal, key, action="try_kernel", agent=agent, entry={"candidate": proposal["candidate"]},
                   guard=guard) if first else execute_trial(ctx, st, proposal, key, agent=agent, guard=guard))
    if t.verdict == "amdahl_suspect" and not remeasure:
        again = {**proposal, "remeasure": True}
        begin(ctx, st, "try_kernel", key + ":remeasure", _jsonable(again))
        kernel_trial(ctx, st, ks, again, key + ":remeasure")
        return
    if t.kept:
        ks.kept.append(str(proposal.get("candidate")))
    decided(st)[str(proposal.get("candidate"))] = f"cycle {st.cycle}: measured end to end, {t.verdict} (trial {t.trial})"
    ks.next += 1
