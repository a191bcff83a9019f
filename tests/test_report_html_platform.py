"""report.html's platform and energy sections, from a real CPU session's ledger: the PRELUDE/CLOSE audit
(a changed setting flagged), why energy is not measured on this CPU machine, and, with readings in the runs,
J/token figures that are the ones `inferloom verify` re-derives from the raw records."""

import copy
import re

import pytest

from inferloom import platform_audit as PA
from inferloom.cli import main
from inferloom.phases.runner import start
from inferloom.report.breakdown import breakdown_from_ledger
from inferloom.report.html import render_html
from inferloom.session import ledger as L
from energy_helpers import verify_with, with_energy
from test_report_html import _cited, _section, assert_self_contained, parse
from test_session import SPEC, agents, two_knob_adapter


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    d = tmp_path_factory.mktemp("htmlplat") / "s"
    start(d, SPEC, budget_minutes=10, max_trials=3, adapter=two_knob_adapter(), agents=agents(), sweep=False,
          kb_url=None)
    assert main(["report", str(d), "--html"]) == 0  # the page as `inferloom report --html` writes it
    return d


def _audits(entries):
    return {e["at_phase"]: e for e in entries if e["kind"] == "platform_audit"}


def test_the_session_page_shows_both_audits_and_no_change(session):
    page = (session / "report.html").read_text()
    parse(page)
    assert_self_contained(page)
    a = _audits(L.read_entries(session))
    sec = _section(page, "platform")
    assert "PRELUDE" in sec and "CLOSE" in sec
    assert _cited(sec, a["PRELUDE"]["seq"]) and _cited(sec, a["CLOSE"]["seq"])
    cpu = a["PRELUDE"]["audit"]["cpu"]
    assert f"{cpu['mem_total_kb']:,} kB" in sec
    assert "No platform setting changed between PRELUDE and CLOSE" in sec and 'class="changed"' not in sec


def test_a_setting_that_differs_at_close_is_flagged(session):
    entries = copy.deepcopy(L.read_entries(session))
    a = _audits(entries)
    before, close = a["PRELUDE"]["audit"], a["CLOSE"]
    close["audit"] = {**close["audit"], "cpu": {**close["audit"]["cpu"], "governors": {"powersave": 2}}}
    close["changes"] = PA.audit_changes(before, close["audit"])
    sec = _section(render_html(breakdown_from_ledger(entries)), "platform")
    row = re.search(r'<tr class="changed">(.*?)</tr>', sec, re.S)
    assert row and "cpu.governors" in row.group(1) and "powersave: 2" in row.group(1)
    assert _cited(row.group(1), close["seq"]) and "No platform setting changed" not in sec


@pytest.mark.skipif(PA.EnergyMeter.open() is not None or PA.RaplMeter.open() is not None,
                    reason="energy is metered on this machine")
def test_on_this_cpu_machine_the_energy_section_says_why_it_is_not_measured(session):
    sec = _section((session / "report.html").read_text(), "energy")
    audit = _audits(L.read_entries(session))["PRELUDE"]["audit"]
    assert "GPU energy per output token not measured" in sec and audit["gpu"]["why"][:40] in sec.replace("&#x27;", "'")
    assert "NVML" in sec or "pynvml" in sec
    assert "CPU energy not measured" in sec and ("intel-rapl" in sec or "can&#x27;t be read" in sec)
    assert "J / output token" not in sec and "Every measurement with energy readings" not in sec


def test_with_readings_the_page_shows_the_j_per_token_that_verify_rederives(session, tmp_path):
    from inferloom.verify.energy import _arm  # verify's own arithmetic, independent of the report's

    entries = with_energy(L.read_entries(session), j_per_s=250.0, offset_j=0.5)
    b = breakdown_from_ledger(entries)
    page = render_html(b)
    parse(page)
    sec = _section(page, "energy")
    meas = [m for m in entries if m["kind"] == L.MEASUREMENT and m.get("protocol")]
    assert meas and "not measured" not in sec.split("CPU energy")[0]
    for m in meas:
        base, cand = _arm(m, "a", "gpu_energy_j"), _arm(m, "b", "gpu_energy_j")
        row = next(r for r in re.findall(r"<tr>(.*?)</tr>", sec, re.S)
                   if _cited(r, m["seq"]) and "<td>gpu</td>" in r)
        assert f"{base['j_per_output_token']:.4f} J" in row and f"{cand['j_per_output_token']:.4f} J" in row
        assert f"{cand['j_per_output_token'] / base['j_per_output_token']:.3f}" in row
    final = next(m for m in meas if m["action"] == "final_compare")
    stock_row = next(r for r in re.findall(r"<tr>(.*?)</tr>", sec, re.S) if r.startswith("<td>stock</td>"))
    assert f"{_arm(final, 'a', 'gpu_energy_j')['j_per_output_token']:.4f} J" in stock_row
    assert _cited(stock_row, final["seq"])
    # the same ledger through `inferloom verify`: its re-derivation agrees with the numbers shown
    v = verify_with(session, tmp_path / "s", entries, b)
    assert not v.mismatches and any(c.group == "energy per token" for c in v.checks)


def test_a_ledger_without_audits_has_neither_section():
    """An older session (no platform audit) renders as it did: no Platform or Energy section, no link to one."""
    page = render_html({"schema_version": 1, "stock": {"objective_median": 1.0, "ledger_seq": 1}})
    parse(page)
    for sid in ("platform", "energy"):
        assert f'id="{sid}"' not in page and f'href="#{sid}"' not in page
