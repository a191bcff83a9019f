"""A pair during one of whose runs a server JIT-compiled (``extra['server_jit']``) is measured again instead of
deciding (the protocol's contract, "A compile is warm-up"): out of ``pairs`` and every look, kept in
``remeasured``, its slot run again in its order on fresh prompts, at most ``protocol.jit_remeasures`` times;
the progress line says which; ``inferloom verify`` re-derives the decision from the counted pairs and refuses a
voided pair the rule doesn't back; the report says, per run, measured again or counted."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace

import numpy as np
import pytest

from inferloom.cli import main
from inferloom.measure.compare import timed_pairs
from inferloom.measure.protocol import ProtocolSettings, decision_at, noise_floor, run_paired
from inferloom.phases.runner import start
from inferloom.report.server_jit import jit_lines, jit_runs
from inferloom.session import ledger as L
from inferloom.spec import ProtocolSpec, load_spec
from inferloom.verify.measurements import check_measurement
from inferloom.verify.record import Findings
from inferloom.workloads.base import RunRecord
from inferloom.workloads.synthetic import SyntheticAdapter
from test_session import SPEC, TWO_KNOBS, agents

# the OLMoE session of 2026-12-06 (docs/results/olmoe-h100-vllm-2026-12-06, ledger #12): the session A/A's prior
OLMOE = ProtocolSettings(min_pairs=3, max_pairs=15, pair_step=2, prior_sd=0.015488689567557841, prior_df=14)
FAST = ProtocolSettings(min_pairs=3, max_pairs=9, pair_step=2)
BASE = 100


def _rec(arm: str, seed: int, value: float, jit: list[str] | None = None) -> RunRecord:
    return RunRecord(config_id=arm, seed=seed, success=True, wall_s=1000.0 / value, output_tokens=1000,
                     expected_output_tokens=1000, num_requests=1, extra={"server_jit": jit} if jit else {})


def _value(arm: str, seed: int, ratio: float, noise: float) -> float:
    """A deterministic throughput per (arm, seed): the same seed gives the same value, whatever ran before."""
    z = np.random.default_rng([seed, 0 if arm == "A" else 1]).standard_normal()
    return 8000.0 * (ratio if arm == "B" else 1.0) * math.exp(noise * z)


def _source(ratio=1.008, noise=0.004, jit=(), slow=0.88, calls=None, fixed=None):
    """run_a, run_b: ``jit`` holds the (arm, seed) runs whose server compiled (their value ``slow`` times lower,
    as a compile makes it); ``fixed`` pins (arm, seed) -> value."""

    def make(arm):
        def run(seed):
            if calls is not None:
                calls.append((arm, seed))
            v = (fixed or {}).get((arm, seed)) or _value(arm, seed, ratio, noise)
            hit = (arm, seed) in jit
            return _rec(arm, seed, v * (slow if hit and (arm, seed) not in (fixed or {}) else 1.0),
                        ["fused_moe_kernel"] if hit else None)
        return run

    return make("A"), make("B")


# ------------------------------------------------------------------------------------------- the protocol

def test_the_olmoe_pair_that_compiled_is_measured_again_and_decides_nothing():
    # pair 1 as measured: the candidate's server compiled fused_moe_kernel during the run; pairs 2 and 3 as measured
    fixed = {("A", BASE): 8191.005090487855, ("B", BASE): 7201.433427038664,
             ("A", BASE + 1): 8214.510403578339, ("B", BASE + 1): 8275.48300636438,
             ("A", BASE + 2): 8136.028458000033, ("B", BASE + 2): 8206.227053780865}
    calls: list = []
    res = run_paired(*_source(jit={("B", BASE)}, fixed=fixed, calls=calls), OLMOE, seed_base=BASE)
    # the old protocol (every pair counts) reverted at 3 pairs for futility on that one pair
    old = run_paired(*_source(jit={("B", BASE)}, fixed=fixed), replace(OLMOE, jit_remeasures=0), seed_base=BASE)
    assert (old.verdict, old.decision.n_pairs, old.decision.stop) == ("revert", 3, "futility")
    assert old.decision.ratio < 0.97 and not old.remeasured
    # now: pair 1 is measured again (its order, fresh prompts: seed_base + max_pairs), the compile in no look
    assert [(p.index, p.seed, p.order, p.remeasure) for p in res.remeasured] == [(0, BASE, "AB", 1)]
    assert res.remeasured[0].value_b == fixed[("B", BASE)] and "JIT compile" in res.remeasured[0].reason
    assert calls[:4] == [("A", BASE), ("B", BASE), ("A", BASE + 15), ("B", BASE + 15)]
    assert [p.seed for p in res.pairs][:3] == [BASE + 15, BASE + 1, BASE + 2]
    assert all(not p.a.extra.get("server_jit") and not p.b.extra.get("server_jit") for p in res.pairs)
    assert res.decision.ratio > 1.0
    # the decision is the one the clean pairs give
    assert res.decision == decision_at(res.log_ratios, OLMOE)
    assert [lk.n_pairs for lk in res.looks] == [n for n in OLMOE.looks() if n <= len(res.pairs)]
    d = json.loads(json.dumps(res.to_dict()))
    assert [p["remeasure"] for p in d["remeasured"]] == [1] and d["settings"]["jit_remeasures"] == 2
    assert "remeasure" not in d["pairs"][0] and "reason" not in d["pairs"][0]
    assert d["remeasured"][0]["b"]["extra"]["server_jit"] == ["fused_moe_kernel"]


def test_the_bound_is_respected_and_then_a_compiling_pair_counts():
    jit = {("B", BASE), ("A", BASE + 1), ("B", BASE + 2)}  # either arm's compile voids alike
    res = run_paired(*_source(jit=jit), FAST, seed_base=BASE)
    assert [(p.index, p.seed, p.order) for p in res.remeasured] == [(0, BASE, "AB"), (1, BASE + 1, "BA")]
    assert [p.seed for p in res.pairs][:3] == [BASE + 9, BASE + 10, BASE + 2]
    assert res.pairs[2].b.extra["server_jit"] == ["fused_moe_kernel"]  # the third counts: the bound is used
    assert res.decision == decision_at(res.log_ratios, FAST)
    # a slot whose repeat compiles again is measured again again (the same order, the next fresh seed)
    res = run_paired(*_source(jit={("B", BASE), ("B", BASE + 9)}), FAST, seed_base=BASE)
    assert [(p.index, p.seed) for p in res.remeasured] == [(0, BASE), (0, BASE + 9)]
    assert res.pairs[0].seed == BASE + 10 and not res.pairs[0].b.extra
    one = run_paired(*_source(jit={("B", BASE), ("B", BASE + 9)}), replace(FAST, jit_remeasures=1), seed_base=BASE)
    assert [p.seed for p in one.remeasured] == [BASE] and one.pairs[0].seed == BASE + 9 and one.pairs[0].b.extra


def test_zero_remeasures_restore_the_old_protocol():
    calls: list = []
    s = replace(FAST, jit_remeasures=0)
    res = run_paired(*_source(jit={("B", BASE), ("A", BASE + 1)}, calls=calls), s, seed_base=BASE)
    assert res.remeasured == [] and res.to_dict()["remeasured"] == []
    assert [p.seed for p in res.pairs] == [BASE + i for i in range(len(res.pairs))]
    assert calls == [(arm, BASE + i) for i in range(len(res.pairs)) for arm in ("AB" if i % 2 == 0 else "BA")]
    assert res.pairs[0].b.extra["server_jit"] and res.pairs[1].a.extra["server_jit"]
    assert res.decision == decision_at(res.log_ratios, s)


def test_the_aa_follows_the_same_rule():
    res = run_paired(*_source(ratio=1.0, jit={("A", BASE + 3)}), FAST, seed_base=BASE, stop_early=False)
    assert len(res.pairs) == FAST.max_pairs and [(p.index, p.seed) for p in res.remeasured] == [(3, BASE + 3)]
    assert res.pairs[3].seed == BASE + FAST.max_pairs
    assert res.decision == decision_at(res.log_ratios, FAST, every_pair=True)
    assert noise_floor(res)["n_pairs"] == FAST.max_pairs


def test_on_pair_hears_the_voided_pair_and_a_failure_keeps_it():
    seen = []
    res = run_paired(*_source(jit={("B", BASE)}), FAST, seed_base=BASE,
                     on_pair=lambda p, d: seen.append((p.index, p.remeasure, d)))
    assert seen[0] == (0, 1, None) and seen[1][:2] == (0, 0) and len(seen) == len(res.pairs) + 1
    run_a, run_b = _source(jit={("B", BASE)})

    def dies(seed):  # the slot's repeat fails: failures are data, the voided pair stays in the record
        return RunRecord(config_id="B", seed=seed, success=False, error="boom") if seed == BASE + 9 else run_b(seed)

    res = run_paired(run_a, dies, FAST, seed_base=BASE)
    assert res.verdict == "failed" and res.pairs == [] and [p.seed for p in res.remeasured] == [BASE]
    assert res.to_dict()["remeasured"][0]["remeasure"] == 1


def test_the_spec_declares_the_bound_and_old_specs_load_with_it():
    assert ProtocolSpec().jit_remeasures == 2 == ProtocolSettings().jit_remeasures
    assert load_spec(None, {"model": "llama-tiny", "protocol.jit_remeasures": 0}).protocol.jit_remeasures == 0
    assert load_spec(None, {"model": "llama-tiny"}).protocol.jit_remeasures == 2
    with pytest.raises(ValueError, match="protocol jit_remeasures"):
        ProtocolSettings(jit_remeasures=11)


# ------------------------------------------------------------------------------------------ the progress line

class _Fake:
    def __init__(self, jit):
        self.run_a, self.run_b = _source(jit=jit)

    def run(self, handle, seed):
        return (self.run_a if handle == "A" else self.run_b)(seed)


def test_the_progress_line_says_measured_again_or_counted():
    said: list[str] = []
    timed_pairs(_Fake({("B", BASE), ("B", BASE + 1), ("B", BASE + 2)}), ["A", "B"], FAST, BASE,
                ("base", "candidate"), said.append)
    jit = [s for s in said if "JIT compile during the run" in s]
    assert len(jit) == 3
    assert jit[0].startswith("pair 1/9 (AB): ") and jit[0].endswith(
        "(its server's log: JIT compile during the run: candidate fused_moe_kernel; measured again, not in the "
        "decision: a compile is warm-up, 1 of 2)")
    assert jit[1].startswith("pair 2/9 (BA): ") and jit[1].endswith("a compile is warm-up, 2 of 2)")
    assert jit[2].startswith("pair 3/9 (AB): ") and jit[2].endswith(
        "(its server's log: JIT compile during the run: candidate fused_moe_kernel; counted: the 2 re-measures are "
        "used)")
    said.clear()
    timed_pairs(_Fake({("B", BASE)}), ["A", "B"], replace(FAST, jit_remeasures=0), BASE, ("base", "candidate"),
                said.append)
    assert [s for s in said if "JIT" in s][0].endswith("counted: protocol.jit_remeasures is 0)")


# ------------------------------------------------------------------------------------------ verify and report

def _entry(res, seq=7, action="try_config"):
    return {"seq": seq, "kind": "measurement", "action": action, "trial": 1, "changes": {"moe_configs": "tuned"},
            "verdict": res.verdict, "protocol": json.loads(json.dumps(res.to_dict()))}


def _bad(m):
    f = Findings()
    check_measurement(f, m, "trial measurements")
    return [f"{c.group}: {c.name}: recorded {c.recorded!r}, recomputed {c.recomputed!r}" for c in f.mismatches]


def test_verify_rederives_from_the_counted_pairs_and_refuses_a_voided_pair_the_rule_does_not_back():
    res = run_paired(*_source(jit={("B", BASE), ("A", BASE + 1), ("B", BASE + 2)}), FAST, seed_base=BASE)
    m = _entry(res)
    assert _bad(m) == []
    f = Findings()
    check_measurement(f, m, "trial measurements")
    assert sum(c.how == "re-measure rule" for c in f.checks) >= 5
    # a voided pair with no compile in its records
    t = copy.deepcopy(m)
    t["protocol"]["remeasured"][0]["b"]["extra"].pop("server_jit")
    bad = _bad(t)
    assert bad and any(b.startswith("pairs: re-measured pair 1 (pair 1, seed 100): a server JIT compile") for b in bad)
    # more re-measures than the recorded bound
    t = copy.deepcopy(m)
    t["protocol"]["settings"]["jit_remeasures"] = 1
    assert any(b.startswith("pairs: pairs measured again (a server JIT compile): recorded 2") for b in _bad(t))
    # a voided pair dropped from the record: the compiling pair 3 then counted before the bound was used
    t = copy.deepcopy(m)
    t["protocol"]["remeasured"].pop(1)
    assert any(b.startswith("pairs: pair 3 (seed 102) counted with a server JIT compile") for b in _bad(t))
    # the voided pair put back into the decision's pairs: the decision no longer follows
    t = copy.deepcopy(m)
    t["protocol"]["pairs"][0] = {k: v for k, v in t["protocol"]["remeasured"][0].items()
                                 if k not in ("remeasure", "reason")}
    assert _bad(t)
    # an A/A (measure_stock) with a voided pair verifies too
    aa = run_paired(*_source(ratio=1.0, jit={("A", BASE + 3)}), FAST, seed_base=BASE, stop_early=False)
    e = _entry(aa, action="measure_stock")
    e["noise"] = noise_floor(aa)
    assert _bad(e) == []


def test_the_report_says_measured_again_or_counted_and_an_old_record_reads_as_it_did():
    res = run_paired(*_source(jit={("B", BASE), ("A", BASE + 1), ("B", BASE + 2)}), FAST, seed_base=BASE)
    rows = jit_runs([_entry(res, seq=12)])
    assert [(r["pair"], r["arm"], r["measured_again"]) for r in rows] == \
        [(0, "candidate", True), (1, "base", True), (2, "candidate", False)]
    text = "\n".join(jit_lines(rows))
    assert "so its pair was measured again on fresh prompts and left out of the decision" in text
    assert ("- trial 1 `moe_configs=tuned`, pair 1, candidate run (" in text
            and "fused_moe_kernel (ledger #12): measured again, not in the decision (re-measure 1 of 2)" in text)
    assert "fused_moe_kernel (ledger #12): counted in the decision (the 2 re-measures were used)" in text
    # written before the rule: no ``remeasured`` key, every pair counted, the lines as they were
    old = _entry(run_paired(*_source(jit={("B", BASE)}), replace(FAST, jit_remeasures=0), seed_base=BASE))
    del old["protocol"]["remeasured"]
    del old["protocol"]["settings"]["jit_remeasures"]
    rows = jit_runs([old])
    assert [sorted(r) for r in rows] == [sorted(["ledger_seq", "trial", "action", "changes", "pair", "arm", "value",
                                                 "kernels"])]
    lines = jit_lines(rows)
    assert lines[3] == ("Each run below paid for a kernel compile its server's log reported during the timed "
                        "requests (vLLM's JIT monitor); its pair stays in the decision, and its value includes the "
                        "compile.")
    assert lines[4].endswith("fused_moe_kernel (ledger #7)")
    assert _bad(old) == []


class _Compiles(SyntheticAdapter):
    """The candidate's server "compiles" during the first timed run of every handle with fast_path on."""

    def run(self, handle, seed):
        rec = super().run(handle, seed)
        self.n = getattr(self, "n", {})
        self.n[handle.id] = self.n.get(handle.id, 0) + 1
        if handle.config.get("fast_path") is True and self.n[handle.id] == 2:  # one warm-up, then timed run 1
            rec.extra["server_jit"] = ["fused_moe_kernel"]
        return rec


def test_a_session_whose_candidate_compiled_verifies_reports_it_and_a_tampered_one_fails(tmp_path, capsys):
    d = tmp_path / "s"
    ad = _Compiles(effects={"fast_path": {True: 1.20}, "useless": {True: 1.0}}, numerics={}, knobs=TWO_KNOBS,
                   noise_sd=0.05)
    start(d, SPEC, budget_minutes=10, max_trials=4, adapter=ad, agents=agents(), sweep=False, kb_url=None)
    meas = [e for e in L.read_entries(d, L.MEASUREMENT) if (e.get("protocol") or {}).get("remeasured")]
    assert meas and all(not (p["b"]["extra"].get("server_jit")) for m in meas for p in m["protocol"]["pairs"])
    assert main(["verify", str(d)]) == 0, capsys.readouterr().out
    capsys.readouterr()
    assert main(["report", str(d)]) == 0
    assert "measured again, not in the decision (re-measure 1 of 2)" in (d / "report.md").read_text()
    capsys.readouterr()
    seq = meas[0]["seq"]
    lines = (d / L.LEDGER_FILE).read_text().splitlines()
    entry = json.loads(lines[seq - 1])
    entry["protocol"]["remeasured"][0]["b"]["extra"].pop("server_jit")
    lines[seq - 1] = json.dumps(entry, separators=(",", ":"))
    (d / L.LEDGER_FILE).write_text("\n".join(lines) + "\n")
    assert main(["verify", str(d)]) == 1
    out = capsys.readouterr().out
    assert any(ln.startswith("MISMATCH pairs: re-measured pair 1 (pair 1, seed ") and f"(ledger seq {seq};" in ln
               for ln in out.splitlines()), out
