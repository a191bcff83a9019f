"""keep_rule.decide: a trial's verdict as a pure function of the evidence, the Critic's ruling and a
guard's finding (the coordinator's execute_trial asks it); and the typed records it reads."""

from __future__ import annotations

import json

import pytest

from inferloom.agents.rule_critic import RuleCritic
from inferloom.measure.keep_rule import KEEP_WITHOUT_EVIDENCE, MALFORMED_RULING, KeepVerdict, decide
from inferloom.measure.records import EVIDENCE_KEYS, Comparison, Evidence, PairedDecision

CHANGES = {"micro_batch": 4}
WIN = dict(changes=CHANGES, protocol_verdict="keep", ratio=1.30, ci_low=1.20, ci_high=1.40, n_pairs=10,
           quality_passed=True, quality_failed=[], noise_floor=0.02, min_gain=0.01, error=None,
           protocol_reason="efficacy")
KEEP = {"decision": "keep", "lesson": "kept it"}
REVERT = {"decision": "revert", "lesson": "reverted it"}
GUARD = ("amdahl_suspect", "more than Amdahl allows")


def ev(**over) -> Evidence:
    return Evidence(**{**WIN, **over})


CASES = [  # (name, evidence, ruling, keyword arguments, kept, outcome, refusal)
    ("keep", ev(), KEEP, {}, True, "keep", None),
    ("critic reverts a supported keep", ev(), REVERT, {}, False, "below-noise-floor", None),
    ("protocol revert", ev(protocol_verdict="revert", ratio=0.9, ci_low=0.85, ci_high=0.95), REVERT, {},
     False, "revert", None),
    ("inconclusive", ev(protocol_verdict="inconclusive", ci_low=0.98), REVERT, {}, False, "inconclusive", None),
    ("failed", ev(protocol_verdict="failed", ratio=None, ci_low=None, ci_high=None, error="died"), REVERT, {},
     False, "failed", None),
    ("quality fail", ev(quality_passed=False, quality_failed=["eval.kl"]), REVERT, {}, False, "reject-quality", None),
    ("unscored quality", ev(quality_passed=None), REVERT, {}, False, "below-noise-floor", None),
    ("below the floor", ev(ci_low=1.02), REVERT, {}, False, "below-noise-floor", None),
    ("critic keeps without evidence: quality", ev(quality_passed=False), KEEP, {}, False, "reject-quality",
     KEEP_WITHOUT_EVIDENCE),
    ("critic keeps without evidence: protocol", ev(protocol_verdict="inconclusive"), KEEP, {}, False,
     "inconclusive", KEEP_WITHOUT_EVIDENCE),
    ("critic keeps without evidence: floor", ev(ci_low=1.02), KEEP, {}, False, "below-noise-floor",
     KEEP_WITHOUT_EVIDENCE),
    ("critic veto of a protocol keep", ev(), REVERT, {}, False, "below-noise-floor", None),
    ("malformed ruling", ev(), {"decision": "maybe"}, {}, False, "below-noise-floor", MALFORMED_RULING),
    ("ruling not a dict", ev(), "keep", {}, False, "below-noise-floor", MALFORMED_RULING),
    ("critic raised", ev(), {"error": "RuntimeError: x"}, {}, False, "below-noise-floor", MALFORMED_RULING),
    ("warm replay reaches min_ratio", ev(), KEEP, {"min_ratio": 1.25}, True, "keep", None),
    ("warm replay drift", ev(), KEEP, {"min_ratio": 1.35}, False, "drift", KEEP_WITHOUT_EVIDENCE),
    ("warm replay drift, critic reverts", ev(), REVERT, {"min_ratio": 1.35}, False, "drift", None),
    ("guard turns the keep", ev(), KEEP, {"guarded": GUARD}, False, "amdahl_suspect", None),
    ("guard on a revert is ignored", ev(protocol_verdict="revert"), REVERT, {"guarded": GUARD}, False, "revert", None),
]


@pytest.mark.parametrize("name, evidence, ruling, kw, kept, outcome, refusal", CASES, ids=[c[0] for c in CASES])
def test_decide_table(name, evidence, ruling, kw, kept, outcome, refusal):
    v = decide(evidence, ruling, **kw)
    assert isinstance(v, KeepVerdict)
    assert (v.kept, v.outcome, v.refusal) == (kept, outcome, refusal), name


def test_the_lesson_is_the_critics_else_the_outcome_and_the_guards_why():
    assert decide(ev(), KEEP).lesson == "kept it"
    assert decide(ev(), {"decision": "keep", "lesson": 3}).lesson == f"{CHANGES}: keep"
    assert decide(ev(), "nonsense").lesson == f"{CHANGES}: below-noise-floor"
    g = decide(ev(), KEEP, guarded=GUARD)
    assert g.lesson == f"{CHANGES}: {GUARD[1]}" and g.guarded == GUARD
    assert decide(ev(protocol_verdict="revert"), REVERT, guarded=GUARD).guarded is None


def test_decide_is_pure():
    e, r = ev(), dict(KEEP)
    before = (json.dumps(e.as_dict(), sort_keys=True), json.dumps(r, sort_keys=True))
    assert decide(e, r) == decide(e, r)
    assert (json.dumps(e.as_dict(), sort_keys=True), json.dumps(r, sort_keys=True)) == before


def test_decide_agrees_with_the_rule_critic_over_a_grid():
    """With the rule critic's ruling, decide keeps exactly what the critic keeps, and never refuses it."""
    for verdict in ("keep", "revert", "inconclusive", "failed"):
        for quality in (True, False, None):
            for lo in (0.95, 1.0, 1.02, 1.04, 1.1):
                for floor in (0.0, 0.02, 0.2):
                    e = ev(protocol_verdict=verdict, quality_passed=quality, ci_low=lo, ratio=max(lo, 1.0) + 0.05,
                           ci_high=max(lo, 1.0) + 0.1, noise_floor=floor)
                    ruling = RuleCritic().judge(e)
                    v = decide(e, ruling)
                    assert v.kept == (ruling["decision"] == "keep") and v.refusal is None, e


# ------------------------------------------------------------------ the records' ledger form
FAILED = {"base_config": {"a": 1}, "candidate_config": {"a": 2}, "seed_base": 7, "verdict": "failed",
          "error": "boom", "error_kind": "oom", "quality": {"evaluated": False}, "timings": {"prepare_base_s": 0.1},
          "wall_s": 0.5}
MEASURED = {"base_config": {"a": 1}, "candidate_config": {"a": 2}, "seed_base": 7,
            "protocol": {"pairs": [{"value_b": 2.0}], "decision": {"ratio": 1.1, "ci_low": 1.05, "ci_high": 1.2,
                                                                  "n_pairs": 6, "reason": "efficacy"}},
            "verdict": "keep", "error": None, "noise": {"ratio": 1.0}, "timings": {"timed_runs_s": 3.0},
            "quality": {"evaluated": True, "passed": False, "failed": ["eval: kl"]}, "wall_s": 4.0}


@pytest.mark.parametrize("d", [FAILED, MEASURED, {**MEASURED, "noise": None}], ids=["failed", "measured", "no-noise"])
def test_comparison_round_trips_to_the_same_json(d):
    want = {k: v for k, v in d.items() if not (k == "noise" and v is None)}
    c = Comparison.from_dict({"action": "try_config", "seq": 3, **d})  # a ledger entry's other keys are ignored
    assert json.dumps(c.as_dict()) == json.dumps(want)  # key order included
    assert json.dumps({"x": 1, **c.as_dict()}) == json.dumps({"x": 1, **want})  # the ledger entry's spread


def test_comparison_reads_the_decision_and_quality_as_attributes():
    c = Comparison.from_dict(MEASURED)
    assert c.decision == PairedDecision(ratio=1.1, ci_low=1.05, ci_high=1.2, n_pairs=6, reason="efficacy")
    assert c.pairs == [{"value_b": 2.0}] and c.quality_passed is False and c.quality_failed == ["eval: kl"]
    f = Comparison.from_dict(FAILED)
    assert f.failed_early and f.decision == PairedDecision() and f.quality_passed is None and f.pairs == []


def test_evidence_keys_order_and_from_a_dict():
    c = Comparison.from_dict(MEASURED)
    e = Evidence.of(c, changes=CHANGES, noise_floor=0.01, min_gain=0.0)
    assert list(e.as_dict()) == list(EVIDENCE_KEYS)
    assert e.as_dict() == {"changes": CHANGES, "protocol_verdict": "keep", "ratio": 1.1, "ci_low": 1.05,
                           "ci_high": 1.2, "n_pairs": 6, "quality_passed": False, "quality_failed": ["eval: kl"],
                           "noise_floor": 0.01, "min_gain": 0.0, "error": None, "protocol_reason": "efficacy"}
    assert Evidence.from_dict(e.as_dict()) == e and Evidence.from_dict(e) is e
    assert Evidence.from_dict({}).ratio is None and Evidence.from_dict("junk") == Evidence.from_dict({})
