"""Does inferloom's own clock see the gain a custom workload's objective claims?

A custom workload's objective is computed inside the user's process (its
entrypoint times its own region and writes ``objective.value``), and a patch
changes the code of that very process: a patch that replaces
``time.perf_counter`` (or scales the value) claims any gain it likes. The
parent process's clock is out of the patch's reach: inferloom times every run
from outside (``wall_s``: start to exit of the entrypoint).

The check, per pair ``i`` of a patch's measurement (A = the stack, trusted: it
is stock or was itself checked; B = the patched candidate):

- the entrypoint reports ``timed_s``, the length of the region its objective
  measures; A's is trusted, B's is not used;
- the objective claims B's region is ``g_i = value_b / value_a`` times faster
  (values in the protocol's orientation: higher is better), so B's run should
  end ``s_pred_i = timed_a_i * (1 - 1/g_i)`` seconds sooner than A's;
- the clock saw ``s_obs_i = wall_a_i - wall_b_i``.

The claim is *contradicted* (rule ``gain_not_seen_by_clock``) when the clock
saw, with one-sided confidence ``1 - alpha`` (a t-bound on the pairs, its
noise pooled with the session's A/A wall-time differences), less
than half the saving the objective claims: ``mean(s_obs - s_pred/2)``'s upper
bound is below 0. A real gain makes ``s_obs ≈ s_pred``, so the check refuses it
only by chance (at most ``alpha`` when the wall-time differences are roughly
normal); a forged one makes ``s_obs ≈ 0``. How small a forged saving the clock
catches depends on the wall-time noise: ``resolution_s`` (the bound's half
width) says it, and a timed region much shorter than it can't be checked, so
make it long (more repeats per run) where that matters.

Without ``timed_s`` on A's runs there is nothing to check against: rule
``clock_unverifiable`` (fail closed: a patch's gain is kept only when the
clock could have contradicted it).

Pure functions over the ledger's pair records (``Pair.to_dict()``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from scipy import stats

__all__ = ["ClockCheck", "clock_check", "GAIN_NOT_SEEN", "CLOCK_UNVERIFIABLE", "ALPHA"]

GAIN_NOT_SEEN = "gain_not_seen_by_clock"
CLOCK_UNVERIFIABLE = "clock_unverifiable"
ALPHA = 0.01


@dataclass
class ClockCheck:
    """The outcome: ``rule`` is None when the clock does not contradict the claim."""

    rule: str | None
    why: str
    n_pairs: int
    claimed_saving_s: float | None = None    # median s_pred
    observed_saving_s: float | None = None   # median s_obs
    bound_s: float | None = None             # upper (1 - alpha) bound of mean(s_obs - s_pred / 2)
    resolution_s: float | None = None        # that bound's half width: noise the check can't see through

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pos(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
        return None
    return float(x)


def _timed(rec: Mapping[str, Any]) -> float | None:
    extra = rec.get("extra") if isinstance(rec.get("extra"), Mapping) else {}
    return _pos(extra.get("timed_s"))


def _walls(p: Mapping[str, Any]) -> tuple[float, float] | None:
    wa, wb = _pos((p.get("a") or {}).get("wall_s")), _pos((p.get("b") or {}).get("wall_s"))
    return None if wa is None or wb is None else (wa, wb)


def clock_check(pairs: Sequence[Mapping[str, Any]], *, noise_pairs: Sequence[Mapping[str, Any]] = (),
                alpha: float = ALPHA) -> ClockCheck:
    """Judge a measurement's pairs (see the module docstring). ``noise_pairs``:
    the session's A/A pairs (stock against stock): their wall-time differences
    join the pairs' residuals in the noise estimate (a pooled standard
    deviation with more degrees of freedom: a forged gain cut short at a few
    pairs is still caught; the wall-time noise is the machine's and the
    workload's, the same for both)."""
    rows = []
    for p in pairs:
        a, b = p.get("a") or {}, p.get("b") or {}
        va, vb = _pos(p.get("value_a")), _pos(p.get("value_b"))
        wa, wb, ta = _pos(a.get("wall_s")), _pos(b.get("wall_s")), _timed(a)
        if ta is None:
            return ClockCheck(CLOCK_UNVERIFIABLE, "the entrypoint's result has no timed_s (the seconds its objective "
                              "measured): inferloom can't check the claimed gain against its own clock; add "
                              "\"timed_s\" to the result (docs/custom.md)", len(pairs))
        if None in (va, vb, wa, wb):
            continue
        s_pred = ta * (1.0 - va / vb)
        rows.append((s_pred, wa - wb))
    n = len(rows)
    if n < 2:
        return ClockCheck(CLOCK_UNVERIFIABLE, f"{n} complete pair(s): too few to check the gain against the clock", n)
    pred = sorted(r[0] for r in rows)
    obs = sorted(r[1] for r in rows)
    d = [o - s / 2 for s, o in rows]
    mean = sum(d) / n
    e = [wa - wb for wa, wb in filter(None, map(_walls, noise_pairs))]
    e_mean = sum(e) / len(e) if e else 0.0
    ss = sum((x - mean) ** 2 for x in d) + sum((x - e_mean) ** 2 for x in e)
    df = n - 1 + max(0, len(e) - 1)
    sd = math.sqrt(ss / df)
    half = float(stats.t.ppf(1 - alpha, df)) * sd / math.sqrt(n)
    bound = mean + half
    med = (lambda v: (v[(n - 1) // 2] + v[n // 2]) / 2)
    out = ClockCheck(None, "", n, med(pred), med(obs), bound, half)
    if bound < 0:
        out.rule = GAIN_NOT_SEEN
        out.why = (f"the objective claims each candidate run ends {out.claimed_saving_s * 1e3:.1f} ms sooner "
                   f"(median over {n} pairs), but inferloom's clock saw {out.observed_saving_s * 1e3:+.1f} ms: less "
                   f"than half the claimed saving with {100 * (1 - alpha):g}% confidence; the gain is not real "
                   f"time (a patched timer or objective?)")
    else:
        out.why = (f"clock agrees: claimed saving {out.claimed_saving_s * 1e3:.1f} ms, observed "
                   f"{out.observed_saving_s * 1e3:+.1f} ms per run (resolution {half * 1e3:.1f} ms)")
    return out
