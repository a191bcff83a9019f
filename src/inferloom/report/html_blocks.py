"""The HTML building blocks the report's sections share (:mod:`inferloom.report.html_sections`,
:mod:`inferloom.report.html_image`, :mod:`inferloom.report.html_platform`, :mod:`inferloom.report.html_llm`):
a ledger citation, a change set, a note for an absent section, a table."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from inferloom.report.fmt import changes_text, esc


def _cite(seq: Any) -> str:
    if isinstance(seq, (list, tuple)):
        seqs = [s for s in seq if s is not None]
        if not seqs:
            return '<span class="cite">(ledger: none)</span>'
        return f'<span class="cite">(ledger {", ".join("#" + esc(s) for s in seqs)})</span>'
    if seq is None:
        return '<span class="cite">(ledger: none)</span>'
    return f'<span class="cite">(ledger #{esc(seq)})</span>'


def _changes(changes: Any) -> str:
    if not isinstance(changes, dict) or not changes:
        return "<code>(none)</code>"
    return "<code>" + esc(changes_text(changes)) + "</code>"


def _absent(why: str) -> str:
    return f'<p class="absent">{why}</p>'


def _table(head: Sequence[tuple[str, bool]], rows: Iterable[Sequence[str]], row_class: Sequence[str] | None = None) -> str:
    """``head``: (label, numeric); cells are already-escaped HTML."""
    h = "".join(f'<th class="num">{esc(t)}</th>' if n else f"<th>{esc(t)}</th>" for t, n in head)
    out = [f'<div class="tw"><table><thead><tr>{h}</tr></thead><tbody>']
    for i, r in enumerate(rows):
        cls = f' class="{row_class[i]}"' if row_class and row_class[i] else ""
        cells = "".join(f'<td class="num">{c}</td>' if head[j][1] else f"<td>{c}</td>" for j, c in enumerate(r))
        out.append(f"<tr{cls}>{cells}</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)
