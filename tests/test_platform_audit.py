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
from energy_helpers import verify_with, with_energy
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


@pytest.mark.skipif(PA.RaplMeter.open() is not None, reason="RAPL counters readable here: CPU energy is metered")
def test_without_rapl_counters_the_cpu_energy_says_why_it_is_skipped(session):
    c = L.read_entries(session, "platform_audit")[0]["audit"]["cpu"]["energy_counters"]
    assert c["available"] is False and ("intel-rapl" in c["why"] or "can't be read" in c["why"])
    report = (session / "report.md").read_text()
    assert f"- CPU energy: not measured ({c['why']})." in report
    runs = [p[arm] for m in L.read_entries(session, L.MEASUREMENT) for p in m["protocol"]["pairs"] for arm in "ab"]
    assert runs and not any("cpu_energy_j" in (r.get("extra") or {}) for r in runs)


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



def test_an_image_workload_reports_energy_per_image():
    """A diffusers run record counts images in ``output_tokens`` (extra.unit "images"): the report says J per
    image at images/s, not per output token (the H200 SD3 session of 2026-12-01 printed "per output token")."""
    from inferloom.report.platform import platform_breakdown, platform_lines

    def rec(j, n, wall):
        return {"success": True, "output_tokens": n, "wall_s": wall,
                "extra": {"unit": "images", "gpu_energy_j": j, "energy_method": "nvml_energy_counter"}}
    final = {"kind": "measurement", "action": "final_compare", "seq": 9, "protocol": {"pairs": [
        {"a": rec(2000.0, 2, 3.0), "b": rec(1600.0, 2, 2.4)}]}}
    audit = {"kind": "platform_audit", "seq": 1, "at_phase": "PRELUDE", "audit": {"cpu": {}, "gpu": {"available": True}}}
    p = platform_breakdown([audit, final])
    assert p["per"] == "image" and p["energy"]["stock"]["j_per_output_token"] == pytest.approx(1000.0)
    text = "\n".join(platform_lines(p))
    assert "1000.0000 J per image at 0.667 images/s" in text and "per output token" not in text
    assert "| base J/image | base images/s |" in text
    from inferloom.report.html_platform import energy_section
    html = energy_section({"platform": p})
    assert "J / image" in html and "images/s" in html and "0.667" in html and "output token" not in html

def test_every_measurement_has_its_energy_per_token_in_the_report_and_verify_rederives_it(session, tmp_path):
    import json

    from inferloom.verify.record import Findings
    from inferloom.verify.energy import check_energy

    entries = with_energy(L.read_entries(session))
    b = breakdown_from_ledger(entries)
    rows = b["platform"]["energy_by_measurement"]
    meas = [m for m in entries if m["kind"] == L.MEASUREMENT and m.get("protocol")]
    assert [r["ledger_seq"] for r in rows] == [m["seq"] for m in meas] and {r["source"] for r in rows} == {"gpu"}
    trial = next(r for r in rows if r["trial"] is not None)
    m = next(x for x in meas if x["seq"] == trial["ledger_seq"])
    runs = [p["b"] for p in m["protocol"]["pairs"] if p["b"]["success"]]
    want = sum(300.0 * r["wall_s"] for r in runs) / sum(r["output_tokens"] for r in runs)
    assert trial["candidate"]["j_per_output_token"] == pytest.approx(want)
    text = render_report(b)
    assert "| measurement | energy | base J/token |" in text
    assert f"| trial {trial['trial']} `" in text and f"#{trial['ledger_seq']} |" in text
    f = Findings()
    check_energy(f, entries, json.loads(json.dumps(b)))
    assert f.checks and not f.mismatches
    # one run's joules changed in the ledger: the breakdown no longer matches it, named by seq
    bad = with_energy(L.read_entries(session), bump=(trial["ledger_seq"], 3.0))
    f = Findings()
    check_energy(f, bad, json.loads(json.dumps(b)))
    assert f.mismatches and {c.seq for c in f.mismatches} == {trial["ledger_seq"]}
    assert any(c.name.endswith("candidate.j_per_output_token") for c in f.mismatches)
    # end to end through `inferloom verify`: a session directory whose ledger carries the readings
    v = verify_with(session, tmp_path / "s", entries, b)
    assert not v.mismatches and any(c.group == "energy per token" for c in v.checks)


def test_rapl_meter_reads_the_package_counters_and_undoes_a_wrap(tmp_path):
    """The RAPL arithmetic on a powercap tree laid out as the kernel's (this machine exposes none)."""
    for name, e, rng in (("intel-rapl:0", 999_000_000, 1_000_000_000), ("intel-rapl:1", 5_000_000, 1_000_000_000)):
        z = tmp_path / name
        z.mkdir()
        (z / "energy_uj").write_text(f"{e}\n")
        (z / "max_energy_range_uj").write_text(f"{rng}\n")
        (z / "name").write_text(f"package-{name[-1]}\n")
    (tmp_path / "intel-rapl:0:0").mkdir()  # a subzone (core): not counted twice
    assert PA.rapl_status(tmp_path) == {"available": True, "zones": ["package-0", "package-1"]}
    meter = PA.RaplMeter.open(tmp_path)

    def work():
        (tmp_path / "intel-rapl:0" / "energy_uj").write_text("1000000\n")  # wrapped: +2 J
        (tmp_path / "intel-rapl:1" / "energy_uj").write_text("8000000\n")  # +3 J
        return "done"

    res, e = meter.measure(work)
    assert res == "done" and e["cpu_energy_j"] == pytest.approx(5.0) and e["cpu_energy_method"].startswith("rapl (2")
    assert PA.rapl_status(tmp_path / "none")["available"] is False
