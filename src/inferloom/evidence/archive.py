"""``inferloom export SESSION_DIR --out FILE.tar.gz``: the whole evidence bundle as one archive.

The archive holds one folder, ``<session_id>/``, with the session's record and what a reviewer needs:

* ``manifest.json`` (provenance and the pin ledger), ``ledger.jsonl`` (every raw record), ``state.json``;
* the reports: ``report.md``, ``session_breakdown.json``, ``report.html`` (those the session has);
* ``export/``: the review bundle (:func:`inferloom.patches.export.export_session`: ``patches/``,
  ``final_config.json`` with the final configuration, ``README.md``);
* ``BUNDLE_HASH``: the hash ``inferloom promote --bundle-hash`` checks (:func:`inferloom.verify.sums.bundle_hash`);
* ``SHA256SUMS``: every other file's sha256 (``sha256sum -c SHA256SUMS`` checks it too).

``inferloom verify FILE.tar.gz`` (or the unpacked folder) checks the sums and then re-derives the numbers.
The archive is written to a temporary name beside ``--out`` and renamed when complete.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from inferloom.patches.export import export_session
from inferloom.session.state import load_state
from inferloom.verify.sums import BUNDLE_HASH_FILE, SUMS_FILE, bundle_hash, sums_text

__all__ = ["ARCHIVE_SUFFIXES", "RECORD_FILES", "is_archive_path", "export_archive"]

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")
RECORD_FILES = ("manifest.json", "ledger.jsonl", "state.json", "report.md", "session_breakdown.json", "report.html")


def is_archive_path(path: str | os.PathLike[str]) -> bool:
    return str(path).endswith(ARCHIVE_SUFFIXES)


def _reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def export_archive(session_dir: str | Path, out: str | Path) -> dict[str, Any]:
    """Write the session in ``session_dir`` as one ``.tar.gz`` at ``out`` (see the module docstring);
    returns ``{"out", "bundle_hash", "files", "series"}``."""
    d = Path(session_dir).absolute()
    st = load_state(d)
    digest = bundle_hash(d)
    out_path = Path(out).absolute()
    with tempfile.TemporaryDirectory(prefix="inferloom-export-") as tmp:
        root = Path(tmp) / st.session_id
        root.mkdir()
        for name in RECORD_FILES:
            if (d / name).is_file():
                shutil.copy2(d / name, root / name)
        review = export_session(d, root / "export")
        (root / BUNDLE_HASH_FILE).write_text(digest + "\n")
        (root / SUMS_FILE).write_text(sums_text(root))
        files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
        part = out_path.with_name(f".{out_path.name}.{os.getpid()}.part")
        try:
            with tarfile.open(part, "w:gz") as tar:
                tar.add(root, arcname=st.session_id, filter=_reset)
            os.replace(part, out_path)
        finally:
            part.unlink(missing_ok=True)
    return {"out": str(out_path), "bundle_hash": digest, "files": files, "series": review["series"]}
