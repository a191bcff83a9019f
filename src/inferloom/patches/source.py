"""Where patch candidates come from: the :class:`PatchSource` Protocol, the
directory source (``custom.patches.dir``) and the command source
(``custom.patches.command``: a Specialist, e.g. a script around an LLM, run
once per candidate). Every candidate goes through the same gates, whoever
wrote it.

A candidate is one ``.patch`` / ``.diff`` file. Its metadata (all optional):

* a header before the first file section: ``Title: ...``, ``Hypothesis:
  ...`` (may continue on indented lines), ``Expected-Gain: +30%`` (or
  ``0.3``); ``Subject: [PATCH] ...`` (git format-patch) is read as the title;
* or a sidecar with the same stem, ``NAME.json`` / ``NAME.yaml``, with keys
  ``title``, ``hypothesis``, ``expected_gain`` (the sidecar wins).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol, runtime_checkable

import yaml

from inferloom.errors import EXIT_RUN_FAILED, InferloomError
from inferloom.process_group import run_in_group
from inferloom.sandbox import Sandbox, start_failure

__all__ = ["PatchCandidate", "PatchSource", "DirectoryPatchSource", "CommandPatchSource", "PatchSourceError",
           "read_metadata"]


@dataclass
class PatchCandidate:
    id: str
    data: bytes
    title: str
    hypothesis: str
    expected_gain: float | None
    origin: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def summary(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "hypothesis": self.hypothesis,
                "expected_gain": self.expected_gain, "origin": self.origin, "sha256": self.sha256,
                "bytes": len(self.data)}


@runtime_checkable
class PatchSource(Protocol):
    """``next_patch(state)`` returns the next candidate, whose ``id`` is not in
    ``state["patches_seen"]`` (ids), or None when it has nothing more. A source
    that cannot produce one raises :class:`PatchSourceError` (the session
    records ``patch_source_failed`` and does not ask it again); it changes
    nothing in ``state``."""

    name: str

    def next_patch(self, state: Mapping[str, Any]) -> PatchCandidate | None: ...


def _gain(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    m = re.match(r"^\s*([+-]?\d+(?:\.\d+)?)\s*(%?)\s*$", str(v))
    if not m:
        return None
    return float(m.group(1)) / (100.0 if m.group(2) else 1.0)


def read_metadata(data: bytes, sidecar: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Title, hypothesis and expected gain from the header (or the sidecar)."""
    text = data.decode("utf-8", errors="replace")
    head: list[str] = []
    for line in text.split("\n"):
        if line.startswith(("diff --git ", "--- ", "Index: ")):
            break
        head.append(line)
    meta: dict[str, Any] = {}
    key = None
    for line in head:
        m = re.match(r"^(Title|Subject|Hypothesis|Expected-Gain):\s*(.*)$", line, re.IGNORECASE)
        if m:
            key = m.group(1).lower()
            val = m.group(2).strip()
            if key == "subject":
                key, val = "title", re.sub(r"^\[PATCH[^\]]*\]\s*", "", val)
            meta[key] = val
        elif key and line[:1] in (" ", "\t") and line.strip():
            meta[key] = (meta[key] + " " + line.strip()).strip()
        else:
            key = None
    for k, v in (sidecar or {}).items():
        meta[str(k).lower().replace("_", "-")] = v
    return {"title": str(meta.get("title") or "").strip(), "hypothesis": str(meta.get("hypothesis") or "").strip(),
            "expected_gain": _gain(meta.get("expected-gain"))}


class DirectoryPatchSource:
    """The ``.patch`` / ``.diff`` files of a directory, in name order."""

    name = "patch-dir"

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)

    def files(self) -> list[Path]:
        if not self.dir.is_dir():
            return []
        return sorted(p for p in self.dir.iterdir() if p.suffix in (".patch", ".diff") and not p.is_dir())

    def load(self, path: Path) -> PatchCandidate:
        """The candidate in ``path`` (and its sidecar); :class:`PatchSourceError`
        when either can't be read or the sidecar can't be parsed."""
        sidecar: dict[str, Any] | None = None
        try:
            data = path.read_bytes()
            for ext in (".json", ".yaml", ".yml"):
                side = path.with_suffix(ext)
                if side.is_file():
                    raw = side.read_text()
                    sidecar = json.loads(raw) if ext == ".json" else yaml.safe_load(raw)
                    sidecar = sidecar if isinstance(sidecar, dict) else None
                    break
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise PatchSourceError(f"patch {path.name}: {type(exc).__name__}: {exc}") from None
        meta = read_metadata(data, sidecar)
        return PatchCandidate(id=path.stem, data=data, title=meta["title"] or path.stem,
                              hypothesis=meta["hypothesis"], expected_gain=meta["expected_gain"], origin=str(path))

    def next_patch(self, state: Mapping[str, Any]) -> PatchCandidate | None:
        seen = set(state.get("patches_seen") or [])
        for p in self.files():
            if p.stem not in seen:
                return self.load(p)
        return None


class PatchSourceError(InferloomError, RuntimeError):
    """A patch source could not produce a candidate (the message says why). The
    patch phase records it and stops asking that source; if it ever reached the
    CLI, the run failed (exit 1)."""

    exit_code = EXIT_RUN_FAILED


class CommandPatchSource:
    """A Specialist as a command: each call gets the session's view as JSON on
    stdin and writes one unified diff to stdout (metadata header as for
    files), or nothing when it has no more ideas. It runs in an empty
    temporary directory (the checkout it reads is ``state["checkout"]``, and
    the patches kept so far are ``state["kept"]``: the current code is the
    checkout with those applied in order). A non-zero exit, a timeout or a
    command that can't start raises :class:`PatchSourceError` (output that is
    not a diff is refused by the parse gate, like any patch). Candidate ids
    are ``specialist-01``, ``specialist-02``, ... in call order. With a
    ``sandbox`` (a session always passes one unless the spec opts out) the
    command runs in it: writable only its temporary directory and a private
    ``/tmp``, no network unless ``network`` (:mod:`inferloom.sandbox`)."""

    name = "specialist-command"
    TAIL = 2000

    def __init__(self, command: list[str], timeout_s: float = 300.0, *, sandbox: Sandbox | None = None,
                 network: bool = False) -> None:
        self.command = list(command)
        self.timeout_s = float(timeout_s)
        self.sandbox = sandbox
        self.network = network

    def next_patch(self, state: Mapping[str, Any]) -> PatchCandidate | None:
        seen = [str(i) for i in state.get("patches_seen") or []]
        n = sum(1 for i in seen if i.startswith("specialist-")) + 1
        while f"specialist-{n:02d}" in seen:  # an id taken by another source's file: the next free one
            n += 1
        pid = f"specialist-{n:02d}"
        with tempfile.TemporaryDirectory(prefix="inferloom-specialist-") as tmp:
            cmd = self.command if self.sandbox is None else self.sandbox.wrap(self.command, cwd=tmp, writable=[tmp],
                                                                              network=self.network)
            try:  # its own process group: a timeout or an interruption kills everything it started
                rc, out, err = run_in_group(cmd, timeout=self.timeout_s, cwd=tmp,
                                            input=json.dumps(dict(state), default=str).encode(),
                                            env={**os.environ, "INFERLOOM_PATCH_ID": pid})
            except OSError as exc:
                raise PatchSourceError(f"specialist command {self.command!r} could not start: {exc}") from None
        if rc is None:
            raise PatchSourceError(f"specialist command {self.command[0]!r} ran past {self.timeout_s:g} s "
                                   "(custom.patches.command_timeout_s); killed")
        if (bwrap_says := start_failure(self.sandbox, rc, err)) is not None:
            raise PatchSourceError(f"specialist command {self.command!r} could not start: {bwrap_says}")
        if rc != 0:
            tail = err.decode("utf-8", "replace")[-self.TAIL:].strip()
            raise PatchSourceError(f"specialist command exited with {rc}: {tail or '(no stderr)'}")
        if not out.strip():
            return None  # nothing more to propose
        meta = read_metadata(out)
        return PatchCandidate(id=pid, data=out, title=meta["title"] or pid, hypothesis=meta["hypothesis"],
                              expected_gain=meta["expected_gain"], origin=f"command: {' '.join(self.command)}")
