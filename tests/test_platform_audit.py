"""Platform audit, read-only, at PRELUDE and CLOSE (a change between them flagged in the report); GPU energy
per output token of the timed runs beside throughput where NVML is present, and on a CPU machine the report
says why it was skipped."""

import pytest

from inferloom import platform_audit as PA
from inferloom.phases.runner import start
from inferloom.report.breakdown import breakdown_from_ledger
from inferloom.report.markdown import render_report
from inferloom.session import ledger as L
from inferloom.verify import verify_session
from test_session import SPEC, agents, two_knob_adapter


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    d = tmp_path_factory.mktemp("audit") / "s"
    start(d, SPEC, budget_minutes=10, max_trials=3, adapter=two_knob_adapter(), agents=agents(), sweep=False,
          kb_url=None)
    return d


def test_a_real_session_audits_at_prelude_and_close(session):
    audits = L.read_entries(session, "platform_audit")
    assert [a["at_phase"] for a in audits] == ["PRELUDE", "CLOSE"]
    first_measure = min(e["seq"] for e in L.read_entries(session, L.MEASUREMENT))
    assert audits[0]["seq"] < first_measure  # taken before anything was timed
    cpu = audits[0]["audit"]["cpu"]
    assert cpu["mem_total_kb"] == int(next(line.split()[1] for line in open("/proc/meminfo")
                                          if line.startswith("MemTotal")))
    assert audits[1]["changes"] == [] and audits[1]["prelude_seq"] == audits[0]["seq"]
    report = (session / "report.md").read_text()
    assert "## Platform" in report and "No platform setting changed between PRELUDE and CLOSE" in report
    assert not verify_session(session).mismatches


@pytest.mark.skipif(PA.EnergyMeter.open() is not None, reason="a GPU machine: energy is metered there")
def test_on_a_cpu_machine_the_gpu_parts_say_why_they_are_skipped(session):
    g = L.read_entries(session, "platform_audit")[0]["audit"]["gpu"]
    assert g["available"] is False and ("NVML" in g["why"] or "pynvml" in g["why"])
    report = (session / "report.md").read_text()
    assert "GPU audit skipped:" in report and "Energy per output token: not measured (" in report


def test_a_change_between_prelude_and_close_is_flagged_in_the_report(session):
    entries = L.read_entries(session)
    close = next(e for e in entries if e["kind"] == "platform_audit" and e["at_phase"] == "CLOSE")
    before = next(e for e in entries if e["kind"] == "platform_audit" and e["at_phase"] == "PRELUDE")["audit"]
    after = {**close["audit"], "cpu": {**close["audit"]["cpu"], "governors": {"powersave": 2}}}
    close["changes"] = PA.audit_changes(before, after)
    assert close["changes"] == [{"what": "cpu.governors", "before": before["cpu"]["governors"],
                                 "after": {"powersave": 2}}]
    text = render_report(breakdown_from_ledger(entries))
    assert "**Changed between PRELUDE and CLOSE: cpu.governors:" in text


def test_audit_changes_ignore_what_moves_by_itself():
    gpu = {"index": 0, "name": "G", "clocks_current_mhz": {"sm": 100}, "clocks_max_mhz": {"sm": 2000},
           "clocks_application_mhz": {"sm": 1500}, "ecc_mode": {"current": 1, "pending": 1}, "persistence_mode": 1,
           "power_limit_w": 700.0, "power_draw_w": 80.0, "temperature_c": 30}
    a = {"cpu": {"mem_available_kb": 1}, "gpu": {"available": True, "gpus": [gpu]}}
    b = {"cpu": {"mem_available_kb": 2}, "gpu": {"available": True, "gpus": [
        {**gpu, "clocks_current_mhz": {"sm": 1980}, "temperature_c": 70, "power_draw_w": 650.0}]}}
    assert PA.audit_changes(a, b) == []
    c = {"cpu": {}, "gpu": {"available": True, "gpus": [{**gpu, "power_limit_w": 500.0}]}}
    assert PA.audit_changes(a, c) == [{"what": "gpu0.power_limit_w", "before": 700.0, "after": 500.0}]


def test_energy_per_output_token_from_the_raw_records():
    from inferloom.report.platform import platform_breakdown

    def rec(j, tok, wall):
        return {"success": True, "output_tokens": tok, "wall_s": wall,
                "extra": {"gpu_energy_j": j, "energy_method": "nvml_energy_counter"}}
    final = {"kind": "measurement", "action": "final_compare", "seq": 9, "protocol": {"pairs": [
        {"a": rec(100.0, 1000, 1.0), "b": rec(60.0, 1000, 0.5)}, {"a": rec(110.0, 1000, 1.0), "b": rec(70.0, 1000, 0.5)}]}}
    audit = {"kind": "platform_audit", "seq": 1, "at_phase": "PRELUDE", "audit": {"cpu": {}, "gpu": {"available": True}}}
    p = platform_breakdown([audit, final])
    assert p["energy"]["stock"]["j_per_output_token"] == pytest.approx(0.105)
    assert p["energy"]["final"]["j_per_output_token"] == pytest.approx(0.065)
    assert p["energy"]["final"]["output_tokens_per_s"] == pytest.approx(2000.0)
