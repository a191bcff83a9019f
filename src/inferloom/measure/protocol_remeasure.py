"""A pair measured again because a server JIT-compiled during one of its runs: the helpers of
:func:`inferloom.measure.protocol.run_paired`'s rule (its module's contract, "A compile is warm-up").

A run's record carries ``extra['server_jit']`` when its server's own log said it JIT-compiled a kernel
during the timed requests (:mod:`inferloom.workloads.server_jit`): a one-off cost (Triton caches the kernel
on disk; a deployed server pays it once), not the steady state the protocol measures. Such a pair is kept
in ``ProtocolResult.remeasured`` with its reason and its slot runs again, at most
``ProtocolSettings.jit_remeasures`` times per protocol run.

The slot runs again in its own order (AB or BA by its index, ABBA kept) on fresh prompts, both arms on the
same ones (the pairing): seed :func:`remeasure_seed`, past every pair's ``seed_base + i`` (``i <
max_pairs``, at most 200) and inside the 1,000 seeds a session gives each measurement
(``phases.common.seed_base``; warm-ups use the seeds below a block's base). Not the voided attempt's seed:
both servers have just served those prompts, and a server's prefix cache (vLLM's is on by default) would
serve the repeat's prefills from it, which no other timed run gets (docs/loadgen.md: fresh prompts per run).
"""

from __future__ import annotations

from typing import Mapping

from inferloom.workloads.base import RunRecord

__all__ = ["jit_kernels", "pair_jit", "remeasure_seed", "remeasure_reason"]


def jit_kernels(rec: RunRecord) -> list[str]:
    """The kernels ``rec``'s server said it compiled during the run (``extra['server_jit']``), [] when none."""
    extra = rec.extra if isinstance(rec.extra, Mapping) else {}
    return [str(k) for k in extra.get("server_jit") or []]


def pair_jit(recs: Mapping[str, RunRecord]) -> dict[str, list[str]]:
    """Arm (``A``, ``B``) -> the kernels its run's server compiled during the run, for the arms that did."""
    return {arm: ks for arm, rec in recs.items() if (ks := jit_kernels(rec))}


def remeasure_seed(seed_base: int, max_pairs: int, n: int) -> int:
    """The prompt seed of the attempt after the ``n``-th voided pair (1-based) of a protocol run."""
    return seed_base + max_pairs + n - 1


def remeasure_reason(jit: Mapping[str, list[str]]) -> str:
    """Why a pair was measured again, in words (its record's ``reason``)."""
    said = "; ".join(f"{arm} {', '.join(sorted(set(ks)))}" for arm, ks in sorted(jit.items()))
    return (f"its server's log: JIT compile during the run ({said}): a compile is warm-up, not the steady state; "
            "measured again on fresh prompts, not in the decision")
