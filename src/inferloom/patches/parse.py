"""Gate (a): does the candidate parse as a text-only unified diff within the
size limits? Pure: bytes in, :class:`ParsedPatch` or :class:`PatchRefusal` out.

Accepted: ``git diff`` / ``diff -u`` output, optionally preceded by free text
(the metadata header: ``Title:``, ``Hypothesis:``, ``Expected-Gain:`` lines,
see :mod:`inferloom.patches.source`). Each file section is an optional
``diff --git`` line with extended headers, then ``---`` / ``+++`` lines and
hunks whose line counts must match their ``@@`` header exactly.

Rules: ``malformed_diff`` (no file section, a bad hunk header, counts that
don't match, quoted path names, ``---`` without ``+++``), ``binary_content``
(NUL bytes, invalid UTF-8, ``GIT binary patch`` or ``Binary files ...
differ``), ``patch_too_large`` (bytes, files or changed lines over the limits).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from inferloom.spec import PatchPolicySpec, field_default

__all__ = ["FileChange", "ParsedPatch", "PatchRefusal", "parse_patch", "MALFORMED", "BINARY", "TOO_LARGE"]

MALFORMED = "malformed_diff"
BINARY = "binary_content"
TOO_LARGE = "patch_too_large"

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_EXT_HEADERS = ("index ", "old mode ", "new mode ", "deleted file mode ", "new file mode ", "similarity index ",
                "dissimilarity index ", "rename from ", "rename to ", "copy from ", "copy to ")


class PatchRefusal(Exception):
    """A gate refused the patch: ``rule`` is the named rule, ``why`` says what and what to do.

    Control flow, not an :class:`~inferloom.errors.InferloomError`: the patch
    phase catches every refusal and records it as a refused trial (a verdict,
    not an error); one that escaped would be a bug and should show its traceback."""

    def __init__(self, rule: str, why: str) -> None:
        super().__init__(f"{rule}: {why}")
        self.rule = rule
        self.why = why


@dataclass
class FileChange:
    old_path: str | None  # None: created
    new_path: str | None  # None: deleted
    old_mode: str | None = None
    new_mode: str | None = None
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    renamed: bool = False
    copied: bool = False  # a copy: ``old_path`` is its source, which the patch leaves unchanged

    @property
    def paths(self) -> list[str]:
        return sorted({p for p in (self.old_path, self.new_path) if p is not None})

    def to_dict(self) -> dict[str, Any]:
        return {"old_path": self.old_path, "new_path": self.new_path, "old_mode": self.old_mode,
                "new_mode": self.new_mode, "added_lines": len(self.added), "removed_lines": len(self.removed),
                "renamed": self.renamed, "copied": self.copied}


@dataclass
class ParsedPatch:
    text: str
    header: str
    files: list[FileChange]

    @property
    def paths(self) -> list[str]:
        return sorted({p for f in self.files for p in f.paths})

    @property
    def changed_paths(self) -> list[str]:
        """The paths the patch says it changes: every path it names except a copy's source."""
        return sorted({p for f in self.files for p in (f.new_path, None if f.copied else f.old_path) if p is not None})

    @property
    def changed_lines(self) -> int:
        return sum(len(f.added) + len(f.removed) for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {"files": [f.to_dict() for f in self.files], "paths": self.paths, "changed_lines": self.changed_lines,
                "bytes": len(self.text.encode())}


def _path(raw: str, prefix: str) -> str | None:
    raw = raw.split("\t")[0].rstrip("\r")
    if raw.startswith('"'):
        raise PatchRefusal(MALFORMED, f"quoted path name {raw!r} is not supported; rename the file to plain characters")
    if raw == "/dev/null":
        return None
    return raw[len(prefix):] if raw.startswith(prefix) else raw


def parse_patch(data: bytes, *, max_bytes: int = field_default(PatchPolicySpec, "max_bytes"),
                max_files: int = field_default(PatchPolicySpec, "max_files"),
                max_changed_lines: int = field_default(PatchPolicySpec, "max_changed_lines")) -> ParsedPatch:
    """Parse ``data`` or raise :class:`PatchRefusal` with the rule it breaks. The
    limits' defaults are the spec's (``custom.patches``)."""
    if len(data) > max_bytes:
        raise PatchRefusal(TOO_LARGE, f"{len(data)} bytes, the limit is {max_bytes}; split the change")
    if b"\0" in data:
        raise PatchRefusal(BINARY, "the patch holds NUL bytes (binary content); only text changes are accepted")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PatchRefusal(BINARY, f"not UTF-8 text ({exc.reason} at byte {exc.start}); only text changes are accepted") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    files: list[FileChange] = []
    header: list[str] = []
    i, n = 0, len(lines)
    cur: FileChange | None = None
    git_section = False

    def need(cond: bool, why: str) -> None:
        if not cond:
            raise PatchRefusal(MALFORMED, f"line {i + 1}: {why}")

    while i < n:
        line = lines[i]
        if line.startswith("GIT binary patch") or (line.startswith("Binary files ") and line.endswith(" differ")):
            raise PatchRefusal(BINARY, f"line {i + 1}: a binary file change; only text changes are accepted")
        if line.startswith("diff --git "):
            m = re.match(r"^diff --git (a/\S+|\"[^\"]*\") (b/\S+|\"[^\"]*\")\s*$", line)
            need(m is not None, f"bad 'diff --git' line {line[:120]!r}")
            assert m is not None
            cur = FileChange(old_path=_path(m.group(1), "a/"), new_path=_path(m.group(2), "b/"))
            files.append(cur)
            git_section = True
            i += 1
            continue
        if git_section and cur is not None and line.startswith(_EXT_HEADERS):
            if line.startswith("new file mode "):
                cur.old_path, cur.new_mode = None, line.split()[-1]
            elif line.startswith("deleted file mode "):
                cur.new_path, cur.old_mode = None, line.split()[-1]
            elif line.startswith("old mode "):
                cur.old_mode = line.split()[-1]
            elif line.startswith("new mode "):
                cur.new_mode = line.split()[-1]
            elif line.startswith(("rename from ", "copy from ")):
                cur.old_path, cur.renamed = _path(line.split(" ", 2)[2], ""), True
                cur.copied = line.startswith("copy from ")
            elif line.startswith(("rename to ", "copy to ")):
                cur.new_path, cur.renamed = _path(line.split(" ", 2)[2], ""), True
            elif line.startswith("index "):
                mode = line.split()[-1] if len(line.split()) == 3 else None
                if mode:
                    cur.old_mode = cur.old_mode or mode
                    cur.new_mode = cur.new_mode or mode
            i += 1
            continue
        if line.startswith("--- "):
            need(i + 1 < n and lines[i + 1].startswith("+++ "), "'---' is not followed by a '+++' line")
            old, new = _path(line[4:], "a/"), _path(lines[i + 1][4:], "b/")
            if not git_section or cur is None:
                cur = FileChange(old_path=old, new_path=new)
                files.append(cur)
            else:
                need((old is None or cur.old_path is None or old == cur.old_path)
                     and (new is None or cur.new_path is None or new == cur.new_path),
                     "the '---' / '+++' paths disagree with the 'diff --git' line")
                if old is None:
                    cur.old_path = None
                if new is None:
                    cur.new_path = None
            git_section = False
            i += 2
            need(i < n and _HUNK.match(lines[i]) is not None, "a file section without any '@@' hunk")
            while i < n and lines[i].startswith("@@"):
                m = _HUNK.match(lines[i])
                need(m is not None, f"bad hunk header {lines[i][:80]!r}")
                assert m is not None
                want_old = int(m.group(2)) if m.group(2) is not None else 1
                want_new = int(m.group(4)) if m.group(4) is not None else 1
                got_old = got_new = 0
                i += 1
                while i < n and (got_old < want_old or got_new < want_new):
                    body = lines[i]
                    tag = body[:1]
                    if tag == " " or body == "":
                        got_old += 1
                        got_new += 1
                    elif tag == "-":
                        got_old += 1
                        cur.removed.append(body[1:])
                    elif tag == "+":
                        got_new += 1
                        cur.added.append(body[1:])
                    elif tag == "\\":
                        pass
                    else:
                        need(False, f"hunk ends early: expected {want_old} old / {want_new} new lines, "
                                    f"got {got_old} / {got_new}")
                    i += 1
                need(got_old == want_old and got_new == want_new,
                     f"hunk line counts don't match its header (old {got_old}/{want_old}, new {got_new}/{want_new})")
                while i < n and lines[i].startswith("\\"):
                    i += 1
            continue
        if files and line == "-- ":  # git format-patch's signature trailer
            break
        if files:
            need(line.strip() == "" and not git_section, f"unexpected line {line[:80]!r} between file sections")
        else:
            header.append(line)
        i += 1
    if not files:
        raise PatchRefusal(MALFORMED, "no file section ('--- a/PATH', '+++ b/PATH', '@@ ... @@'); "
                                      "expected a unified diff such as `git diff` writes")
    for f in files:
        if f.old_path is None and f.new_path is None:
            raise PatchRefusal(MALFORMED, "a file section names no path")
    patch = ParsedPatch(text=text, header="\n".join(header).strip(), files=files)
    if len(files) > max_files:
        raise PatchRefusal(TOO_LARGE, f"{len(files)} files, the limit is {max_files}; split the change")
    if patch.changed_lines > max_changed_lines:
        raise PatchRefusal(TOO_LARGE, f"{patch.changed_lines} changed lines, the limit is {max_changed_lines}")
    return patch
