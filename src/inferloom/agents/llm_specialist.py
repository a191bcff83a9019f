"""The LLM Specialist: a :class:`~inferloom.patches.source.PatchSource` whose
patches an LLM writes for a custom workload. Every patch goes through the very
same pipeline as a file's or a command's (parse, policy and allowlist, the
effect gate, the patch critic, the paired measurement with the workload's own
quality gate); nothing it says is trusted.

It is shown what a patch source sees (the patches tried and their outcomes
with the rule that refused them, the kept patches, the entrypoint, the
objective, the policy) plus the text of the files the policy allows it to
touch (read from the checkout, capped). It answers a :class:`PatchProposal`
(title, hypothesis, expected gain, a unified diff). ``max_patches`` bounds the
patches it writes per session; an LLM call that gives nothing usable is
``patch_source_failed`` naming the rule (``llm_schema_invalid``, ...), and the
source is not asked again this session.
"""

from __future__ import annotations

import fnmatch
import json
import subprocess
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field

from inferloom.agents.llm_client import LLMClient
from inferloom.agents.llm_record import LLMRefusal
from inferloom.patches.source import PatchCandidate, PatchSourceError

__all__ = ["PatchProposal", "LLMPatchSource", "SPECIALIST_SYSTEM", "MAX_FILE_CHARS"]

MAX_FILE_CHARS = 20_000  # per file shown; more is cut (and said)
MAX_FILES = 20


class PatchProposal(BaseModel):
    """The Specialist's answer."""

    model_config = ConfigDict(extra="forbid")
    title: str = Field(min_length=1, max_length=200)
    hypothesis: str = Field(min_length=1, max_length=2000, description="why it is faster; the files it touches")
    expected_gain: float | None = Field(None, ge=-1.0, le=100.0)
    diff: str = Field(min_length=1, max_length=200_000, description="a unified diff (git diff format)")


SPECIALIST_SYSTEM = (
    "You are the Specialist of inferloom. Write ONE source patch that makes the workload faster (its objective) "
    "without changing its results: a unified diff against the checkout, touching only files the policy allows, "
    "never the quality gate or the benchmark harness. State the hypothesis (what is slow and why the patch helps, "
    "naming the files). inferloom applies it in a scratch tree, checks it against the policy, measures it in "
    "interleaved pairs against the current code and keeps it only if it is faster and the quality gate passes. "
    "Do not repeat a patch that was tried. Answer only with the JSON object of the schema.")


def _files(checkout: str, allow: list[str]) -> dict[str, str]:
    try:
        names = subprocess.run(["git", "ls-files"], cwd=checkout, capture_output=True, text=True, check=True,
                               timeout=30).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    out: dict[str, str] = {}
    for n in names:
        if allow and not any(fnmatch.fnmatch(n, pat) for pat in allow):
            continue
        try:
            text = (Path(checkout) / n).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        out[n] = text if len(text) <= MAX_FILE_CHARS else text[:MAX_FILE_CHARS] + "\n... (cut)"
        if len(out) >= MAX_FILES:
            break
    return out


class LLMPatchSource:
    """See the module docstring."""

    name = "llm-specialist"

    def __init__(self, client: LLMClient, max_patches: int = 5) -> None:
        self.client, self.max_patches = client, int(max_patches)
        self.last_calls: list[dict[str, Any]] = []

    def next_patch(self, state: Mapping[str, Any]) -> PatchCandidate | None:
        seen = [str(i) for i in state.get("patches_seen") or []]
        mine = [i for i in seen if i.startswith("llm-")]
        if len(mine) >= self.max_patches:
            return None
        policy = dict(state.get("policy") or {})
        view = {k: state.get(k) for k in ("outcomes", "entrypoint", "objective", "higher_is_better")}
        view["kept"] = [{k: p.get(k) for k in ("id", "title", "diff")} for p in state.get("kept") or []]
        view["policy"] = policy
        files = _files(str(state.get("checkout") or "."), list(policy.get("allowlist") or []))
        user = ("The session so far (JSON):\n" + json.dumps(view, default=str) + "\n\nFiles you may change:\n" +
                "\n".join(f"--- {n}\n{t}" for n, t in files.items()) + "\n\nWrite the next patch.")
        try:
            answer, self.last_calls = self.client.ask("specialist", SPECIALIST_SYSTEM, user, PatchProposal)
        except LLMRefusal as exc:
            self.last_calls = exc.calls
            raise PatchSourceError(f"{exc.rule}: {exc.why}") from None
        n = len(mine) + 1
        data = answer.diff if answer.diff.endswith("\n") else answer.diff + "\n"
        return PatchCandidate(id=f"llm-{n:02d}", data=data.encode(), title=answer.title,
                              hypothesis=answer.hypothesis, expected_gain=answer.expected_gain,
                              origin=f"{self.name} ({self.client.llm.model})")
