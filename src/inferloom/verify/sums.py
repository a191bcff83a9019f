"""The evidence bundle's checksums: ``SHA256SUMS`` of an exported session, the bundle hash a person
promotes, and the safe unpacking of an export archive. Standard library only (hashlib, tarfile).

* :func:`bundle_hash`: sha256 over the session's own record, ``manifest.json`` and ``ledger.jsonl``
  without its ``promotion`` entries (so that promoting a session does not change what was promoted):
  the hash ``inferloom export`` prints and writes in ``BUNDLE_HASH``, that ``inferloom promote`` records
  and, given ``--bundle-hash``, checks.
* :func:`sums_text` / :func:`check_sums`: ``SHA256SUMS`` in ``sha256sum`` format (``<hex>  <path>``,
  sorted), every file of the bundle but itself; a changed, missing or unlisted file is a mismatch naming it.
* :func:`unpack`: an archive's members into a directory, refusing anything but plain files and folders
  under one top folder (no absolute path, no ``..``, no link, no device).
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

from inferloom.verify.record import Findings, VerifyError

__all__ = ["SUMS_FILE", "BUNDLE_HASH_FILE", "PROMOTION_KIND", "bundle_hash", "sums_text", "check_sums", "unpack",
           "sha256_file"]

SUMS_FILE = "SHA256SUMS"
BUNDLE_HASH_FILE = "BUNDLE_HASH"
PROMOTION_KIND = "promotion"
_MAX_MEMBERS = 100_000


def sha256_file(path: Path) -> str:
    """The sha256 of ``path``. A copy of :func:`inferloom.pins.file_sha256` on purpose: verify shares no code
    with the computing path but the ledger reader (tests/test_verify.py)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _ledger_without_promotions(path: Path) -> bytes:
    out = []
    for line in path.read_bytes().splitlines(keepends=True):
        try:
            kind = json.loads(line).get("kind")
        except (ValueError, AttributeError):
            kind = None
        if kind != PROMOTION_KIND:
            out.append(line)
    return b"".join(out)


def bundle_hash(directory: str | Path) -> str:
    """``sha256:<hex>`` of the session's manifest and its ledger less its promotion entries."""
    d = Path(directory)
    h = hashlib.sha256()
    for name in ("manifest.json", "ledger.jsonl"):
        p = d / name
        if not p.is_file():
            raise VerifyError(f"{d}: no {name}; not a session directory (pass the directory `optimize` wrote)")
        data = _ledger_without_promotions(p) if name == "ledger.jsonl" else p.read_bytes()
        h.update(f"{name}\n{hashlib.sha256(data).hexdigest()}\n".encode())
    return "sha256:" + h.hexdigest()


def sums_text(root: str | Path) -> str:
    """``SHA256SUMS`` of every file under ``root`` but ``root/SHA256SUMS`` itself."""
    r = Path(root)
    names = sorted(p.relative_to(r).as_posix() for p in r.rglob("*") if p.is_file() and p != r / SUMS_FILE)
    return "".join(f"{sha256_file(r / n)}  {n}\n" for n in names)


def check_sums(root: str | Path, f: Findings) -> bool:
    """Check ``root/SHA256SUMS`` against the files under ``root``; each file is one check (group
    ``SHA256SUMS``). False when ``root`` has no SHA256SUMS (nothing checked)."""
    r = Path(root)
    sums = r / SUMS_FILE
    if not sums.is_file():
        return False
    listed: dict[str, str] = {}
    for i, line in enumerate(sums.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not name:
            f.add("SHA256SUMS", f"line {i}", line[:80], "'<sha256>  <path>'", None, False)
            continue
        listed[name] = digest
    for name, digest in sorted(listed.items()):
        p = r / name
        if ".." in Path(name).parts or Path(name).is_absolute():
            f.add("SHA256SUMS", name, digest, "a path inside the bundle", None, False)
        elif not p.is_file():
            f.add("SHA256SUMS", name, digest, "file missing", None, False)
        else:
            got = sha256_file(p)
            f.add("SHA256SUMS", name, digest, got, None, got == digest, "sha256")
    present = {p.relative_to(r).as_posix() for p in r.rglob("*") if p.is_file() and p != sums}
    for extra in sorted(present - set(listed)):
        f.add("SHA256SUMS", extra, "not listed", sha256_file(r / extra), None, False, "sha256")
    return True


def unpack(archive: str | Path, into: str | Path) -> Path:
    """Unpack an export archive (``.tar.gz``) into ``into``; returns its one top folder. VerifyError for
    an unreadable archive or a member that is not a plain file or folder under one top folder."""
    a = Path(archive)
    try:
        with tarfile.open(a, "r:*") as tar:
            members = tar.getmembers()
            if len(members) > _MAX_MEMBERS:
                raise VerifyError(f"{a}: {len(members)} members, more than an export holds ({_MAX_MEMBERS})")
            tops = set()
            for m in members:
                parts = Path(m.name).parts
                if not parts or Path(m.name).is_absolute() or ".." in parts or not (m.isfile() or m.isdir()):
                    raise VerifyError(f"{a}: member {m.name!r} is not a plain file or folder inside the archive; "
                                      "this is not an archive `inferloom export` wrote")
                tops.add(parts[0])
            if len(tops) != 1:
                raise VerifyError(f"{a}: expected one top folder, found {len(tops)}; not an `inferloom export` archive")
            tar.extractall(into, members=members, filter="data")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise VerifyError(f"{a}: not a readable .tar.gz archive ({exc}); pass the file `inferloom export` wrote") from None
    return Path(into) / tops.pop()
