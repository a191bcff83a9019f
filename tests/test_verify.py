"""``inferloom verify``: every headline number re-derived from the raw ledger records alone, by a module
that shares nothing with the computing path but the ledger reader."""

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from inferloom.cli import main
from inferloom.phases.runner import start
from inferloom.session import ledger as L
from inferloom.verify import VerifyError, verify_session
from inferloom.verify import stats as S
from test_architecture import G
from test_session import SPEC, agents, two_knob_adapter

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = sorted(p.parent for p in (ROOT / "docs" / "results").rglob("ledger.jsonl"))
CAMPAIGN = ROOT / "docs" / "results" / "h200-campaign-2026-11-30" / "session"


def _verify(capsys, d):
    rc = main(["verify", str(d)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _edit(d: Path, seq: int, change) -> None:
    """Rewrite ledger entry ``seq`` of the session in ``d`` through ``change(entry)``."""
    lines = (d / L.LEDGER_FILE).read_text().splitlines()
    entry = json.loads(lines[seq - 1])
    assert entry["seq"] == seq
    change(entry)
    lines[seq - 1] = json.dumps(entry, separators=(",", ":"))
    (d / L.LEDGER_FILE).write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    d = tmp_path_factory.mktemp("verify") / "s"
    st = start(d, SPEC, budget_minutes=10, max_trials=4, adapter=two_knob_adapter(), agents=agents(),
               sweep=False, kb_url=None)
    assert any(t.kept for t in st.trials)
    return d


def test_committed_sessions_exist():
    assert len(COMMITTED) >= 3


@pytest.mark.parametrize("d", COMMITTED, ids=lambda p: p.relative_to(ROOT / "docs" / "results").as_posix())
def test_every_committed_session_verifies(capsys, d):
    rc, out, err = _verify(capsys, d)
    assert rc == 0, out + err
    assert "all consistent" in out and "MISMATCH" not in out
    kept = '"final_compare"' in (d / "ledger.jsonl").read_text()  # CLOSE compared a kept stack with stock
    judged = '"kind":"verdict"' in (d / "ledger.jsonl").read_text().replace(" ", "")  # a session whose budget
    # ended in PRELUDE (r2/c1) judged no trial: it has no verdicts and no keep rule to re-derive
    # a goodput (trace) session places nothing under the roofline (phases/roofline.roofline_skip): no fractions
    placed = any(e.get("stock") for e in L.read_entries(d) if e["kind"] == "roofline")
    for group in ("pairs", "A/A noise", "stock median", "time breakdown") + (("ceiling fractions",) if placed else ()) \
            + (("trial verdicts", "keep rule") if judged else ()) + (("CLOSE compare",) if kept else ()):
        assert group in out  # a session that kept nothing has no CLOSE comparison to re-derive


def test_a_fresh_session_verifies(capsys, fresh):
    rc, out, err = _verify(capsys, fresh)
    assert rc == 0, out + err
    f = verify_session(fresh)
    kept = [c for c in f.checks if c.group == "keep rule" and c.name.endswith("kept")]
    assert kept and all(c.ok for c in kept)
    assert {"A/A (stock)", "trial measurements", "CLOSE compare", "time breakdown"} <= {c.group for c in f.checks}


def test_a_changed_pair_value_in_a_fresh_session_fails(capsys, fresh, tmp_path):
    d = tmp_path / "s"
    shutil.copytree(fresh, d)
    seq = next(e["seq"] for e in L.read_entries(d, L.MEASUREMENT) if e.get("action") == "try_config")

    def bump(e):
        e["protocol"]["pairs"][1]["value_b"] *= 1.03
    _edit(d, seq, bump)
    rc, out, _ = _verify(capsys, d)
    assert rc == 1
    assert f"pair 1 log_ratio: recorded" in out and f"(ledger seq {seq};" in out


def _tampered(tmp_path, seq, change):
    d = tmp_path / "s"
    shutil.copytree(CAMPAIGN, d)
    _edit(d, seq, change)
    return d


@pytest.mark.parametrize("seq,change,name", [
    # a pair's value: its log-ratio, and the look's mean no longer follow
    (8, lambda e: e["protocol"]["pairs"][2].__setitem__("value_b", e["protocol"]["pairs"][2]["value_b"] * 1.02),
     "pair 2 log_ratio"),
    # a verdict's ratio (trial 1 cites measurement seq 8)
    (10, lambda e: e.__setitem__("ratio", e["ratio"] * 1.001), "trial 1 ratio"),
    # the CLOSE ratio in the measurement itself
    (35, lambda e: e["protocol"]["decision"].__setitem__("ratio", 3.1), "decision.ratio"),
    # a ceiling
    (4, lambda e: e["stock"].__setitem__("ceiling_tok_per_s", e["stock"]["ceiling_tok_per_s"] * 1.1),
     "stock ceiling_tok_per_s"),
    # a bootstrap endpoint moved outside its Monte-Carlo band
    (24, lambda e: e["protocol"]["decision"].__setitem__("boot_ci_low", e["protocol"]["decision"]["boot_ci_low"] * 0.97),
     "decision.boot_ci_low"),
    # a keep whose interval says revert
    (14, lambda e: e["protocol"]["decision"].__setitem__("verdict", "keep"), "decision.verdict"),
])
def test_one_changed_number_fails_naming_it_and_its_seq(capsys, tmp_path, seq, change, name):
    d = _tampered(tmp_path, seq, change)
    rc, out, _ = _verify(capsys, d)
    assert rc == 1
    lines = [ln for ln in out.splitlines() if ln.startswith("MISMATCH") and f": {name}: recorded" in ln]
    assert lines and all(f"(ledger seq {seq};" in ln for ln in lines), out


def test_a_changed_breakdown_number_fails(capsys, tmp_path):
    d = tmp_path / "s"
    shutil.copytree(CAMPAIGN, d)
    b = json.loads((d / "session_breakdown.json").read_text())
    b["final"]["ratio"] *= 1.01
    b["time_s"]["harness"] += 1.0
    (d / "session_breakdown.json").write_text(json.dumps(b))
    rc, out, _ = _verify(capsys, d)
    assert rc == 1
    assert "final.ratio: recorded" in out and "(ledger seq 35;" in out
    assert "time_s.harness: recorded" in out


@pytest.mark.parametrize("damage", ["no ledger", "bad breakdown", "wrong shape", "corrupt ledger"])
def test_a_malformed_directory_is_one_line_exit_2(capsys, tmp_path, damage):
    d = tmp_path / "s"
    shutil.copytree(CAMPAIGN, d)
    if damage == "no ledger":
        (d / L.LEDGER_FILE).unlink()
    elif damage == "bad breakdown":
        (d / "session_breakdown.json").write_text("{not json")
    elif damage == "wrong shape":
        _edit(d, 8, lambda e: e["protocol"]["pairs"][0].__setitem__("value_a", "fast"))
    else:
        lines = (d / L.LEDGER_FILE).read_text().splitlines()
        (d / L.LEDGER_FILE).write_text("\n".join(lines[:3] + ["garbage"] + lines[3:]) + "\n")
    rc, out, err = _verify(capsys, d)
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("inferloom verify: error:") and str(d) in err
    with pytest.raises(VerifyError):
        verify_session(d)


def test_the_monte_carlo_band_holds_an_endpoint_drawn_with_another_seed():
    """The band of the recorded seed's endpoint is built from other seeds; an endpoint drawn with a seed
    outside them (as another scipy would draw) falls inside it."""
    rng = np.random.default_rng(7)
    for n in (3, 5, 9, 15):
        for trial in range(5):
            a = rng.lognormal(7.0, 0.05, n)
            b = a * rng.lognormal(0.1, 0.05, n)
            level = 1 - 0.05 / 3
            lo, hi, _ = S.bootstrap_interval(a, b, level, 999, 10_000 + trial)
            (lo_min, lo_max), (hi_min, hi_max) = S.mc_band(a, b, level, 999, 0)
            assert lo_min <= lo <= lo_max and hi_min <= hi <= hi_max
            assert lo_max - lo_min < hi - lo and hi_max - hi_min < hi - lo  # narrower than the interval itself


def test_the_statistics_agree_with_the_decision_they_check():
    d = np.log([1.1, 1.2, 1.15, 1.18, 1.12])
    lo, hi = S.t_interval(d, 0.95)
    assert lo < d.mean() < hi and math.isclose((lo + hi) / 2, d.mean())
    assert S.rule(math.log(1.02), 1.0, 0.01, False) == "keep"
    assert S.rule(-1.0, math.log(1.005), 0.01, False) == "revert"
    assert S.rule(-1.0, 1.0, 0.01, True) == "inconclusive"
    assert S.planned_looks(5, 15, 2) == [5, 7, 9, 11, 13, 15] and S.planned_looks(5, 10, 2) == [5, 7, 9, 10]


INDEPENDENT_OF = ("inferloom.measure", "inferloom.report", "inferloom.phases", "inferloom.agents",
                  "inferloom.workloads", "inferloom.kb", "inferloom.bench")
ALLOWED = {"inferloom.session.ledger", "inferloom.inputs", "inferloom.errors"}


def test_verify_shares_nothing_with_the_computing_path_but_the_ledger_reader():
    graph = G.module_graph(with_local=True)
    own = {m for m in graph if m == "inferloom.verify" or m.startswith("inferloom.verify.")}
    assert own, "no inferloom.verify modules found"
    direct = {t for m in own for t in graph[m]} - own
    assert direct <= ALLOWED | {"inferloom.session"}, f"verify imports {sorted(direct - ALLOWED)}"
    seen, todo = set(), list(own)
    while todo:
        m = todo.pop()
        for t in graph.get(m, ()):
            if t not in seen:
                seen.add(t)
                todo.append(t)
    bad = sorted(m for m in seen if m.startswith(INDEPENDENT_OF))
    assert not bad, f"inferloom.verify reaches the computing path: {bad}"


def test_a_kept_trial_whose_lower_end_does_not_clear_the_aa_floor_is_flagged(capsys, fresh, tmp_path):
    """The keep rule (min_gain and the A/A floor together) is re-derived from the A/A's own record: an A/A
    that resolved a 2x instance effect makes every kept trial's lower end fall short of the floor."""
    d = tmp_path / "s"
    shutil.copytree(fresh, d)
    aa = next(e for e in L.read_entries(d, L.MEASUREMENT) if e.get("action") == "measure_stock")
    kept = [e for e in L.read_entries(d, "verdict") if e.get("kept")]
    assert kept and all("floor" in next(m for m in L.read_entries(d, L.MEASUREMENT) if m["seq"] == v["measurement_seq"])
                        ["protocol"]["settings"] for v in kept)
    assert not [c for c in verify_session(d).checks if c.group == "keep rule" and not c.ok]

    def slower_instance(e):
        e["protocol"]["decision"].update(ratio=0.5, ci_low=0.49, ci_high=0.51)
    _edit(d, aa["seq"], slower_instance)
    rc, out, _ = _verify(capsys, d)
    assert rc == 1
    for v in kept:
        lines = [ln for ln in out.splitlines() if ln.startswith("MISMATCH") and f"trial {v['trial']} kept: recorded" in ln]
        assert lines and f"(ledger seq {v['seq']};" in lines[0] and "A/A floor 1.0" in lines[0], out
