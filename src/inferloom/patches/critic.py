"""Gate (c): the patch critic's sign-off. Deterministic rules, no model:

* ``no_hypothesis``: the candidate states no hypothesis (why it should be
  faster); a reviewer could not judge its scope.
* ``diff_outside_hypothesis``: a touched file is named neither in the
  hypothesis nor in the title (by its path or its file name): the diff does
  more than the hypothesis claims.

An LLM-backed critic must fit :class:`PatchCritic` and still returns a rule
name with every refusal.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any, Mapping, Protocol, runtime_checkable

__all__ = ["PatchCritic", "RulePatchCritic"]


@runtime_checkable
class PatchCritic(Protocol):
    """``review(evidence) -> {"decision": "sign_off" | "refuse", "rule": str | None, "why": str}``;
    ``evidence`` holds ``title``, ``hypothesis`` and ``paths`` (every path the diff touches)."""

    name: str

    def review(self, evidence: Mapping[str, Any]) -> Any: ...


class RulePatchCritic:
    name = "rule-patch-critic"

    def review(self, evidence: Mapping[str, Any]) -> dict[str, Any]:
        hyp = str(evidence.get("hypothesis") or "").strip()
        if not hyp:
            return {"decision": "refuse", "rule": "no_hypothesis",
                    "why": "the patch states no hypothesis; add a 'Hypothesis:' header naming the files it changes and why"}
        text = f"{evidence.get('title') or ''} {hyp}"
        outside = [p for p in evidence.get("paths") or [] if p not in text and PurePosixPath(p).name not in text]
        if outside:
            return {"decision": "refuse", "rule": "diff_outside_hypothesis",
                    "why": f"the diff touches {', '.join(outside)}, which its hypothesis does not name"}
        return {"decision": "sign_off", "rule": None,
                "why": f"every touched file ({', '.join(evidence.get('paths') or [])}) is named by the hypothesis"}
