"""A session's report files, written into its directory from the ledger alone
(``inferloom report DIR`` re-renders them at any time):
``session_breakdown.json`` and ``report.md`` (:func:`write_artifacts`), and
``report.html`` (:func:`write_html`). Each is written atomically."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inferloom.report.breakdown import breakdown_from_ledger
from inferloom.report.html import render_html
from inferloom.report.markdown import render_report
from inferloom.session import ledger as L
from inferloom.session.atomic import write_json_atomic
from inferloom.session.manifest import ManifestError, read_manifest
from inferloom.spec import objective_label

__all__ = ["write_artifacts", "write_html"]


def _objective_label(d: Path) -> str:
    """What the session's objective values are (from the manifest's spec)."""
    try:
        return objective_label(read_manifest(d).get("spec") or {})
    except (ManifestError, OSError, ValueError):
        return "output tok/s"


def write_artifacts(directory: Path | str) -> dict[str, Any]:
    """Write session_breakdown.json and report.md from the ledger alone."""
    d = Path(directory)
    b = breakdown_from_ledger(L.read_entries(d))
    b["objective_label"] = _objective_label(d)
    write_json_atomic(d / "session_breakdown.json", b)
    tmp = d / ".report.md.tmp"
    tmp.write_text(render_report(b))
    tmp.replace(d / "report.md")
    return b


def write_html(directory: Path | str, out: Path | str | None = None, breakdown: dict[str, Any] | None = None) -> Path:
    """Render the session in ``directory`` (from its ledger, unless a
    ``breakdown`` is given) to ``out`` (default ``DIR/report.html``), atomically."""
    d = Path(directory)
    if breakdown is None:
        breakdown = breakdown_from_ledger(L.read_entries(d))
    manifest = None
    mp = d / "manifest.json"
    if mp.is_file():
        try:
            manifest = json.loads(mp.read_text())
        except (OSError, ValueError):
            manifest = None
    path = Path(out) if out else d / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(render_html(breakdown, manifest=manifest), encoding="utf-8")
    tmp.replace(path)
    return path
