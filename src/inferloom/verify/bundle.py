"""``inferloom verify`` on an exported bundle: an ``inferloom export`` archive (``.tar.gz``, unpacked into a
temporary folder) or its unpacked folder. Its ``SHA256SUMS`` is checked first (a changed, missing or unlisted
file is a mismatch naming it), then its ``BUNDLE_HASH`` against the manifest and ledger, then every number
(:func:`inferloom.verify.session.verify_session`). A plain session directory has no SHA256SUMS: only the numbers."""

from __future__ import annotations

import tempfile
from pathlib import Path

from inferloom.verify.record import Findings, VerifyError
from inferloom.verify.session import verify_session
from inferloom.verify.sums import BUNDLE_HASH_FILE, bundle_hash, check_sums, unpack

__all__ = ["verify_path"]


def _verify_dir(d: Path, f: Findings) -> Findings:
    if check_sums(d, f):
        n = sum(1 for c in f.checks if c.group == "SHA256SUMS")
        f.notes.append(f"SHA256SUMS: {n} file(s) checked")
        hp = d / BUNDLE_HASH_FILE
        if hp.is_file():
            f.add("bundle hash", BUNDLE_HASH_FILE, hp.read_text().strip(), bundle_hash(d), None,
                  hp.read_text().strip() == bundle_hash(d), "sha256")
    g = verify_session(d)
    f.checks += g.checks
    f.notes += g.notes
    return f


def verify_path(path: str | Path) -> Findings:
    """Every check of a session directory, an export archive or an unpacked export; VerifyError (exit 2)
    when it can't be read."""
    p = Path(path)
    if p.is_file():
        with tempfile.TemporaryDirectory(prefix="inferloom-verify-") as tmp:
            root = unpack(p, tmp)
            f = _verify_dir(root, Findings())
            f.notes.insert(0, f"archive {p}: unpacked folder {root.name}/")
            return f
    if not p.is_dir():
        raise VerifyError(f"{p}: no such session directory or export archive")
    return _verify_dir(p, Findings())
