"""Gate (c): the patch critic's sign-off. Deterministic rules, no model:

* ``no_hypothesis``: the candidate states no hypothesis (why it should be
  faster); a reviewer could not judge its scope.
* ``malformed_evidence``: ``paths`` is not a non-empty list of paths (the
  parse gate always gives one; fail-closed, nothing to check is no sign-off).
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
    ``evidence`` holds ``title``, ``hypothesis`` and ``paths`` (every path the diff touches).

    Fail-closed: it signs off only what it could check; a refusal names its
    rule; malformed evidence is refused, not raised on (the session refuses
    anything but ``sign_off``, and a raise as ``critic_error``)."""

    name: str

    def review(self, evidence: Mapping[str, Any]) -> Any: ...


class RulePatchCritic:
    name = "rule-patch-critic"

    def review(self, evidence: Mapping[str, Any]) -> dict[str, Any]:
        hyp = str(evidence.get("hypothesis") or "").strip()
        if not hyp:
            return {"decision": "refuse", "rule": "no_hypothesis",
                    "why": "the patch states no hypothesis; add a 'Hypothesis:' header naming the files it changes and why"}
        paths = evidence.get("paths")
        if not isinstance(paths, (list, tuple)) or not paths or not all(isinstance(p, str) and p for p in paths):
            return {"decision": "refuse", "rule": "malformed_evidence",
                    "why": f"the evidence's paths ({paths!r}) is not a non-empty list of the paths the diff touches"}
        text = f"{evidence.get('title') or ''} {hyp}"
        outside = [p for p in paths if p not in text and PurePosixPath(p).name not in text]
        if outside:
            return {"decision": "refuse", "rule": "diff_outside_hypothesis",
                    "why": f"the diff touches {', '.join(outside)}, which its hypothesis does not name"}
        return {"decision": "sign_off", "rule": None,
                "why": f"every touched file ({', '.join(paths)}) is named by the hypothesis"}
