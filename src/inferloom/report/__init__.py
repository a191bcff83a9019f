"""A session's reports, each a pure function of its ledger.

* :mod:`~inferloom.report.breakdown`: the breakdown (``session_breakdown.json``)
  from the ledger entries; every number cites its ledger seq.
* :mod:`~inferloom.report.markdown`: ``report.md`` from the breakdown.
* :mod:`~inferloom.report.html` (sections in :mod:`~inferloom.report.html_sections`,
  charts in :mod:`~inferloom.report.svg`): the self-contained ``report.html``.
* :mod:`~inferloom.report.artifacts`: writes those files into a session directory.
* :mod:`~inferloom.report.console`: the rich tables of ``inferloom bench`` and ``knobs``.
* :mod:`~inferloom.report.fmt`: the formatters they share.
"""

from inferloom.report.artifacts import write_artifacts, write_html
from inferloom.report.breakdown import BREAKDOWN_SCHEMA_VERSION, breakdown_from_ledger
from inferloom.report.html import SECTIONS, render_html
from inferloom.report.markdown import render_report

__all__ = ["BREAKDOWN_SCHEMA_VERSION", "SECTIONS", "breakdown_from_ledger", "render_html", "render_report",
           "write_artifacts", "write_html"]
