"""A session's report files, written into its directory from the ledger alone
(``inferloom report DIR`` re-renders them at any time):
``session_breakdown.json`` and ``report.md`` (:func:`write_artifacts`), and
``report.html`` (:func:`write_html`). Each is written atomically, through
:func:`inferloom.redact.redact_text` (no URL credential in a report).

A report is never replaced by one computed from fewer ledger entries than the
one on disk cites (an emptied or truncated ledger): :func:`cited_seq` reads
the highest ledger seq the existing ``session_breakdown.json`` and
``report.md`` cite (old files included: every number there cites its seq),
and :class:`PartialLedger` (exit 2) is raised before anything is written."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from inferloom.report.breakdown import breakdown_from_ledger
from inferloom.report.deploy import session_deploy
from inferloom.report.html import render_html
from inferloom.errors import InferloomError
from inferloom.redact import redact, redact_text
from inferloom.report.markdown import render_report
from inferloom.session import ledger as L
from inferloom.session.atomic import write_json_atomic
from inferloom.session.manifest import ManifestError, read_manifest
from inferloom.spec import objective_label

__all__ = ["PartialLedger", "cited_seq", "write_artifacts", "write_html"]

_CITE = re.compile(r"ledger #(\d+)")


class PartialLedger(InferloomError, ValueError):
    """The ledger holds fewer entries than the report on disk cites."""


def _seqs(value: Any) -> list[int]:
    """Every ledger seq a breakdown cites (keys ``ledger_seq``, ``*_seq``, ``ledger_seqs``, ``replayed``)."""
    out: list[int] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and (k.endswith("_seq") or k in ("ledger_seqs", "replayed")):
                out += [x for x in (v if isinstance(v, list) else [v]) if isinstance(x, int) and not isinstance(x, bool)]
            else:
                out += _seqs(v)
    elif isinstance(value, list):
        for v in value:
            out += _seqs(v)
    return out


def cited_seq(directory: Path | str) -> int:
    """The highest ledger seq that the report files already in ``directory`` cite (0 when none)."""
    d = Path(directory)
    best = 0
    try:
        best = max([best, *_seqs(json.loads((d / "session_breakdown.json").read_text()))])
    except (OSError, ValueError):
        pass
    try:
        best = max([best, *(int(m) for m in _CITE.findall((d / "report.md").read_text(errors="replace")))])
    except OSError:
        pass
    return best


def _check_not_fewer(d: Path, entries: list[dict[str, Any]]) -> None:
    cited = cited_seq(d)
    if cited > len(entries):
        raise PartialLedger(
            f"{d}: ledger.jsonl holds {len(entries)} entries but the report already there cites ledger #{cited}; "
            "a report from this partial history would replace a fuller one, so nothing was written: restore "
            "ledger.jsonl from a backup (or move report.md and session_breakdown.json away to render it anyway)")


def _objective_label(d: Path) -> str:
    """What the session's objective values are (from the manifest's spec)."""
    try:
        return objective_label(read_manifest(d).get("spec") or {})
    except (ManifestError, OSError, ValueError):
        return "output tok/s"


def write_artifacts(directory: Path | str) -> dict[str, Any]:
    """Write session_breakdown.json and report.md from the ledger alone."""
    d = Path(directory)
    entries = L.read_entries(d)
    _check_not_fewer(d, entries)
    b = breakdown_from_ledger(entries)
    b["objective_label"] = _objective_label(d)
    write_json_atomic(d / "session_breakdown.json", redact(b))
    tmp = d / ".report.md.tmp"
    tmp.write_text(redact_text(render_report(b, deploy=session_deploy(d, entries))))
    tmp.replace(d / "report.md")
    return b


def write_html(directory: Path | str, out: Path | str | None = None, breakdown: dict[str, Any] | None = None) -> Path:
    """Render the session in ``directory`` (from its ledger, unless a
    ``breakdown`` is given) to ``out`` (default ``DIR/report.html``), atomically."""
    d = Path(directory)
    if breakdown is None:
        entries = L.read_entries(d)
        _check_not_fewer(d, entries)
        breakdown = breakdown_from_ledger(entries)
    manifest = None
    mp = d / "manifest.json"
    if mp.is_file():
        try:
            manifest = json.loads(mp.read_text())
        except (OSError, ValueError):
            manifest = None
    path = Path(out) if out else d / "report.html"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(redact_text(render_html(breakdown, manifest=manifest, deploy=session_deploy(d))), encoding="utf-8")
    tmp.replace(path)
    return path
