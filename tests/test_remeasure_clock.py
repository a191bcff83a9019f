"""`verify --remeasure` of a custom session repeats the session's clock check on the re-measured pairs:
a final stack whose objective claims a gain inferloom's own wall clock does not see fails the re-measure,
overlap or not. The case: the hostile corpus's forged timer (c01), kept by a session whose clock guard was
switched off (what an inferloom without the check, or a hole in it, would have kept)."""

import shutil

import pytest

from inferloom.cli import main
from inferloom.evidence.remeasure import remeasure
from inferloom.measure.clock_check import GAIN_NOT_SEEN
from inferloom.phases import custom_trial as custom_phase  # the patch trial asks its clock_guard
from inferloom.phases.runner import start
from inferloom.session import ledger as L
from test_hostile_patches import CORPUS, FORGED, _agents, make_repo, make_spec


@pytest.fixture(scope="module")
def forged(tmp_path_factory):
    root = tmp_path_factory.mktemp("forged")
    repo = make_repo(root / "checkout")
    patches = root / "patches"
    patches.mkdir()
    shutil.copy(CORPUS / f"{FORGED}.patch", patches)
    d = root / "session"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(custom_phase, "clock_guard", lambda ctx, key, pid, out: (lambda _ev: None))
        st = start(d, make_spec(repo, patches), budget_minutes=10, max_trials=2, agents=_agents(), kb_url=None,
                   sweep=False, progress=lambda m: None)
    return {"dir": d, "st": st}


def test_the_forged_timer_kept_without_the_guard_fails_the_remeasure_on_the_clock(forged, capsys):
    kept = [k.id for k in forged["st"].extra.source.kept]
    assert kept == [FORGED]  # the session, its clock guard off, kept the forged gain: x100s
    final = next(e for e in L.read_entries(forged["dir"], L.MEASUREMENT) if e.get("action") == "final_compare")
    assert final["protocol"]["decision"]["ratio"] > 100
    r = remeasure(forged["dir"])
    assert r["overlaps"] is True  # the protocol alone reproduces the forged ratio ...
    assert r["remeasured"]["quality_passed"] is True
    c = r["clock"]  # ... but inferloom's clock, around each fresh run, saw no saving
    assert c["rule"] == GAIN_NOT_SEEN and c["bound_s"] < 0 and c["n_pairs"] >= 2
    assert c["claimed_saving_s"] > 0.3 and abs(c["observed_saving_s"]) < 0.15
    assert r["passed"] is False and "clock check FAILED (gain_not_seen_by_clock" in r["why"]
    assert main(["verify", str(forged["dir"]), "--remeasure", "--trust-session", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "remeasure clock check: gain_not_seen_by_clock:" in out and "FAIL" in out
