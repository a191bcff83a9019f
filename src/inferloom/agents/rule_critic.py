"""The deterministic critic (see ``inferloom.agents.rules``): it keeps what the
session's keep rule admits (``measure.keep_rule``) and says why in one line."""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

from inferloom.measure.keep_rule import keep_threshold, session_keep
from inferloom.measure.records import Evidence

__all__ = ["RuleCritic"]


def _fmt(changes: Mapping[str, Any]) -> str:
    text = ", ".join(f"{k}={json.dumps(v) if isinstance(v, bool) else v}" for k, v in changes.items())
    return text or "(no change)"


def _pct(ratio: float) -> str:
    return f"{(ratio - 1.0) * 100:+.1f}%"


class RuleCritic:
    """Keep iff ``protocol_verdict == "keep"``, ``quality_passed is True`` (or,
    with ``allow_unscored=True``, ``None``: counted as an unscored keep by the
    coordinator) and ``ci_low > (1 + min_gain)(1 + noise_floor)`` (no ``min_gain``: 0; ``session_keep``);
    all else, malformed evidence too, is reverted (fail-closed). ``judge`` gives ``{"decision", "lesson"}``."""

    name = "rule-critic"

    def __init__(self, allow_unscored: bool = False) -> None:
        self.allow_unscored = allow_unscored

    def judge(self, evidence: Evidence | Mapping[str, Any]) -> dict[str, str]:
        ev = Evidence.from_dict(evidence)  # evidence handed over as a dict: a missing key is None
        what = _fmt(ev.changes or {})
        verdict = ev.protocol_verdict
        err = str(ev.error or "").strip().splitlines()
        verdict_text = f"{verdict} ({err[0][:200]})" if err else f"{verdict}"
        try:
            ratio, lo, hi = (float(x) for x in (ev.ratio, ev.ci_low, ev.ci_high))  # type: ignore[arg-type]
            floor, gain = float(ev.noise_floor or 0.0), float(ev.min_gain or 0.0)
            if not all(math.isfinite(x) for x in (ratio, lo, hi, floor, gain)):
                raise ValueError
        except (TypeError, ValueError):
            return {"decision": "revert", "lesson": f"{what}: protocol verdict {verdict_text}, "
                    "no usable ratio / interval / noise floor in the evidence: reverted"}
        n = ev.n_pairs
        head = f"{what}: {_pct(ratio)} [{_pct(lo)}, {_pct(hi)}] over {n} pairs"
        passed = ev.quality_passed
        failed = "; ".join(str(x) for x in ev.quality_failed or [])
        quality = f"failed quality ({failed})" if failed else "failed quality"

        if verdict == "revert":  # a futility stop is not "slower": say why the protocol stopped
            why = ("a gain worth keeping is out of reach: futility" if "futility" in str(ev.protocol_reason) else
                   "grossly slower: harm stop before the first look" if "(harm)" in str(ev.protocol_reason) else "slower")
            return self._revert(f"{head}: reverted ({why})" + (f"; also {quality}" if passed is False else ""))
        if verdict == "inconclusive":
            return self._revert(f"{what}: {_pct(ratio)} [{_pct(lo)}, {_pct(hi)}], inconclusive after {n} pairs: reverted")
        if verdict != "keep":
            return self._revert(f"{head}: protocol verdict {verdict_text}: reverted")
        if passed is False:
            return self._revert(f"{head}, faster but {quality}: reverted")
        if passed is None and not self.allow_unscored:
            return self._revert(f"{head}, faster but has no quality verdict: reverted")
        if not session_keep(protocol_verdict=verdict, quality_passed=passed, ci_low=lo, min_gain=gain, floor=floor,
                            allow_unscored=self.allow_unscored):
            return self._revert(f"{head}: reverted (lower bound {_pct(lo)} does not clear the noise floor {floor * 100:.1f}% "
                                f"on top of the minimum gain {gain * 100:.1f}%: x{keep_threshold(gain, floor):.4f})")
        scored = "quality passed" if passed is True else "quality not scored (unscored keep)"
        return {"decision": "keep", "lesson": f"{head}, {scored}: kept"}

    @staticmethod
    def _revert(lesson: str) -> dict[str, str]:
        return {"decision": "revert", "lesson": lesson}
