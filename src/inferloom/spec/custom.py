"""The spec of a custom workload (``framework: custom``): the user's checkout,
its entrypoint, its knobs, and what a source patch may touch (docs/custom.md).
Part of :mod:`inferloom.spec`, which re-exports these models."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from inferloom.spec.fields import _n, _Strict

__all__ = ["CustomKnob", "PatchPolicySpec", "CustomSpec"]


class CustomKnob(_Strict):
    """One setting the user's code reads: an environment variable or an argument."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$")
    kind: Literal["choice", "int", "bool"] = "choice"
    default: Any = Field(description="the stock value")
    choices: list[Any] | None = None
    low: int | None = None
    high: int | None = None
    env: str | None = Field(None, description="passed as this environment variable")
    arg: str | None = Field(None, description="passed as this argument (e.g. --block VALUE)")
    description: str = "a setting the workload reads"
    changes_numerics: bool = False

    @field_validator("env")
    @classmethod
    def _env(cls, v: str | None) -> str | None:
        if v is not None and (not v.replace("_", "a").isalnum() or v.startswith("INFERLOOM_")):
            raise ValueError("expected an environment variable name (letters, digits, _), not INFERLOOM_*")
        return v


class PatchPolicySpec(_Strict):
    """What a source patch may touch (docs/custom.md). Paths are relative to the checkout."""

    dir: str | None = Field(None, description="a directory of .patch / .diff files (the candidates)")
    command: list[str] | None = Field(
        None, min_length=1, description="a Specialist: a command that proposes one patch per call (JSON state on "
        "stdin, a unified diff or nothing on stdout; docs/custom.md)")
    command_timeout_s: float = _n(300.0, 0, 86400, "seconds: a Specialist call past this fails", gt=True)
    command_network: bool = Field(
        False, description="let the Specialist command use the host's network (e.g. to reach a remote model); its "
        "filesystem stays read-only (docs/security.md)")
    allowlist: list[str] = Field(default_factory=list, description="glob patterns of paths a patch may touch")
    quality_gate: list[str] = Field(default_factory=list, description="files of the quality gate (never editable)")
    benchmark_inputs: list[str] = Field(default_factory=list, description="benchmark input files (never editable)")
    protected: list[str] = Field(
        default_factory=list, description="more files no candidate may change (patterns, like the above); with the "
        "entrypoint, the quality gate and the benchmark inputs they are checksummed at session start and verified "
        "before every run")
    forbidden_patterns: list[str] = Field(default_factory=list, description="regexes no added line may match")
    max_bytes: int = _n(256 * 1024, 1, 64 << 20, "bytes of one patch at most")
    max_files: int = _n(20, 1, 10_000, "files one patch may touch")
    max_changed_lines: int = _n(2000, 1, 1_000_000, "changed lines of one patch at most")

    @field_validator("dir")
    @classmethod
    def _dir(cls, v: str | None) -> str | None:
        if v is not None:
            p = Path(v).expanduser()
            if not p.is_dir():
                raise ValueError(f"{v} is not a directory; expected a directory of .patch / .diff files")
            return str(p.resolve())
        return v

    @field_validator("forbidden_patterns")
    @classmethod
    def _patterns(cls, v: list[str]) -> list[str]:
        for pat in v:
            try:
                re.compile(pat)
            except re.error as exc:
                raise ValueError(f"pattern {pat!r} is not a valid regular expression ({exc})") from None
        return v


class CustomSpec(_Strict):
    """A user-supplied workload (``framework: custom``): a git checkout and an
    entrypoint that writes one JSON result per run (docs/custom.md)."""

    repo: str = Field(description="a git checkout of the user's code (never modified)")
    entrypoint: list[str] = Field(min_length=1, description="the command, run in a copy of the checkout")
    entrypoint_files: list[str] = Field(default_factory=list, description="files of the entrypoint (never editable)")
    objective: str = Field("objective", description="the objective's name, for the report")
    higher_is_better: bool = True
    timeout_s: float = _n(120.0, 0, 86400, "seconds: a run of the entrypoint past this fails", gt=True)
    knobs: list[CustomKnob] = Field(default_factory=list)
    patches: PatchPolicySpec = PatchPolicySpec()
    sandbox: Literal["bwrap", "none"] = Field(
        "bwrap", description="bwrap: the entrypoint and the Specialist command run under bubblewrap (read-only "
        "root, no network); a spec with patches is refused where it can't run. none: the explicit opt-out, "
        "recorded in the manifest and the report (docs/security.md)")

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str) -> str:
        p = Path(v).expanduser()
        if not (p / ".git").exists():
            raise ValueError(f"{v} is not a git checkout (no .git); expected the path of a git working tree")
        return str(p.resolve())
