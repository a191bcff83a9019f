"""One conformance class per agent Protocol, run against every implementation:
Orchestrator, Critic, Robustness (inferloom/agents/base.py), the patch critic
(patches/critic.py) and the patch source (patches/source.py). The contracts
are the ones written in the Protocols' docstrings.

A new implementation is tested by adding it to the list of its Protocol
(``ORCHESTRATORS``, ``CRITICS``, ...); ``test_every_implementation_is_registered``
fails until it is."""

from __future__ import annotations

import copy
import json
import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
from conformance_helpers import classes_with, qualname

from inferloom.agents.base import ACTIONS, Critic, Orchestrator, Robustness
from inferloom.agents.llm_client import LLMClient, Transport
from inferloom.agents.llm_record import Reply, ReplayTransport
from inferloom.measure.keep_rule import session_keep
from inferloom.agents.llm_roles import LLMCritic, LLMOrchestrator
from inferloom.agents.llm_specialist import LLMPatchSource
from inferloom.agents.rules import RuleCritic, RuleOrchestrator, RuleRobustness
from inferloom.patches.critic import PatchCritic, RulePatchCritic
from inferloom.patches.source import (CommandPatchSource, DirectoryPatchSource, PatchCandidate, PatchSource,
                                      PatchSourceError)
from inferloom.spec import load_spec
from inferloom.workloads.base import Knob, config_key, resolve_config
from inferloom.workloads.registry import make_adapter

from inferloom.phases.allowlist import PHASE_ALLOWLIST, validate_proposal

# ------------------------------------------------------------------ LLM-backed agents
LLM = load_spec(None, {"agents.llm.provider": "openai", "agents.llm.model": "conformance"}).agents.llm


class _AnswerTransport:
    """A transport whose 'LLM' answers what ``answer(state)`` gives (no network): the LLM
    roles' wrapping (schema, validation, output) is what these tests check."""

    name = "conformance"

    def __init__(self, answer: Callable[[], dict[str, Any]]) -> None:
        self.answer = answer

    def send(self, role, system, messages, schema, schema_name, max_tokens):
        return Reply(json.dumps(self.answer()), 10, 5)


def _llm_orchestrator(seed: int) -> LLMOrchestrator:
    """LLMOrchestrator whose LLM answers as the rule orchestrator would (a well-behaved LLM)."""
    rule, seen = RuleOrchestrator(seed=seed), {}
    client = LLMClient(LLM, _AnswerTransport(lambda: {k: v for k, v in rule.propose(seen["state"]).items()
                                                      if k in ("action", "changes", "predicted_gain", "rationale")}),
                       tempfile.mkdtemp(prefix="inferloom-llm-conf-"))
    o = LLMOrchestrator(client)
    ask = o.propose
    o.propose = lambda state: (seen.update(state=state), ask(state))[1]  # type: ignore[method-assign]
    return o


def _llm_critic() -> LLMCritic:
    """LLMCritic whose LLM always answers keep (the most permissive LLM): it still keeps nothing unsupported."""
    return LLMCritic(LLMClient(LLM, _AnswerTransport(lambda: {"decision": "keep", "lesson": "looks fine"}),
                               tempfile.mkdtemp(prefix="inferloom-llm-conf-")))


def _same(x: Any) -> Any:
    """An output without its LLM call records (latency and transcript numbers differ from call to call)."""
    return {k: v for k, v in x.items() if k != "llm_calls"} if isinstance(x, dict) else x


# ------------------------------------------------------------------ registries
ORCHESTRATORS = [pytest.param(lambda seed: RuleOrchestrator(seed=seed), id="rule-orchestrator"),
                 pytest.param(_llm_orchestrator, id="llm-orchestrator")]
CRITICS = [pytest.param(RuleCritic, id="rule-critic"), pytest.param(_llm_critic, id="llm-critic")]
ROBUSTNESS = [pytest.param(RuleRobustness, id="rule-robustness")]
PATCH_CRITICS = [pytest.param(RulePatchCritic, id="rule-patch-critic")]


@dataclass(frozen=True)
class SourceCase:
    """``make(tmp)`` builds a source with at least two candidates to give;
    ``broken(tmp)`` one that cannot produce its candidate (None: no such case)."""

    make: Callable[[Path], PatchSource]
    broken: Callable[[Path], PatchSource] | None


DIFF = "--- a/{p}\n+++ b/{p}\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"


def _directory(tmp: Path) -> PatchSource:
    d = tmp / "patches"
    d.mkdir()
    (d / "01-plain.patch").write_text(DIFF.format(p="a.py"))
    (d / "02-header.diff").write_text("Title: faster b\nHypothesis: b.py does less work\nExpected-Gain: +5%\n\n"
                                      + DIFF.format(p="b.py"))
    (d / "03-sidecar.patch").write_text(DIFF.format(p="c.py"))
    (d / "03-sidecar.json").write_text(json.dumps({"title": "c", "hypothesis": "c.py", "expected_gain": 0.1}))
    (d / "notes.txt").write_text("not a patch")
    return DirectoryPatchSource(d)


def _broken_directory(tmp: Path) -> PatchSource:
    src = _directory(tmp)
    (src.dir / "01-plain.json").write_text("{not json")
    return src


SPECIALIST = """
import json, os, sys
state = json.load(sys.stdin)
n = sum(1 for i in state.get("patches_seen", []) if str(i).startswith("specialist-"))
if n < {count}:
    print("Title: idea " + os.environ["INFERLOOM_PATCH_ID"])
    print("Hypothesis: m.py")
    print()
    sys.stdout.write({diff!r})
sys.exit({rc})
"""


def _command(tmp: Path, rc: int = 0) -> PatchSource:
    script = tmp / "specialist.py"
    script.write_text(SPECIALIST.format(count=2, diff=DIFF.format(p="m.py"), rc=rc))
    return CommandPatchSource([sys.executable, str(script)], timeout_s=60)


def _llm_specialist(tmp: Path, answer: dict[str, Any] | None = None) -> PatchSource:
    """LLMPatchSource whose LLM answers the same patch every time (two at most), or ``answer``."""
    good = {"title": "faster m", "hypothesis": "m.py does less work", "expected_gain": 0.1, "diff": DIFF.format(p="m.py")}
    client = LLMClient(LLM, _AnswerTransport(lambda: answer or good), tmp / "llm-session")
    return LLMPatchSource(client, max_patches=2)


SOURCES = [pytest.param(SourceCase(_directory, _broken_directory), id="patch-dir"),
           pytest.param(SourceCase(_command, lambda tmp: _command(tmp, rc=3)), id="specialist-command"),
           pytest.param(SourceCase(_llm_specialist, lambda tmp: _llm_specialist(tmp, {"diff": 1})),
                        id="llm-specialist")]

REGISTERED = {
    ("propose",): {qualname(RuleOrchestrator), qualname(LLMOrchestrator)},
    ("judge",): {qualname(RuleCritic), qualname(LLMCritic)},
    ("check",): {qualname(RuleRobustness)},
    ("review",): {qualname(RulePatchCritic)},
    ("next_patch",): {qualname(DirectoryPatchSource), qualname(CommandPatchSource), qualname(LLMPatchSource)},
}


@pytest.mark.parametrize("methods", list(REGISTERED), ids=lambda m: m[0])
def test_every_implementation_is_registered(methods):
    # a class with propose() but also rewritable() is a KernelBackend (its own suite)
    found = classes_with(*methods, without=("rewritable",))
    assert found == REGISTERED[methods], f"register it in this module's lists: {sorted(found - REGISTERED[methods])}"


# ------------------------------------------------------------------ views
SPEC = load_spec(None, {"model": "llama-tiny", "device": "cpu", "traffic.concurrency": "4"})
ENGINE_KNOBS = make_adapter(SPEC).knob_space()  # the transformers engine's: FRAMEWORK and KERNEL knobs
SYNTHETIC_KNOBS = make_adapter(load_spec(None, {"framework": "synthetic"})).knob_space()


def make_view(knobs, device="cpu", pinned=None, stack=None, **extra) -> dict[str, Any]:
    """The state dict an agent is handed (as state.json loads, plus the derived keys)."""
    stock = resolve_config(knobs, {})
    state = {"phase": "FRAMEWORK", "cycle": 1, "device": device, "knobs": [k.to_dict() for k in knobs],
             "stock_config": stock, "stack": resolve_config(knobs, stack or {}), "pinned": pinned or {},
             "trials": [], "measured_config_keys": [config_key(stock)], "noise_floor": None, "extra": {},
             "workload": {"concurrency": 4, "input_len": 128, "output_len": 64, "dtype": stock.get("dtype", "float32"),
                          "model": "llama-tiny"},
             "started_at": 1000.0, "cycle_started_at": 1000.0, "proposals": [], "kb_failures": []}
    state.update(extra)
    return json.loads(json.dumps(state))


def record(view: dict[str, Any], proposal: dict[str, Any], verdict: str, ratio: float, t: float) -> None:
    """A measured trial of ``proposal`` in ``view``, as the coordinator writes it."""
    cfg = proposal["config"]
    view["trials"].append({"trial": len(view["trials"]) + 1, "cycle": view["cycle"], "changes": proposal["changes"],
                           "config": cfg, "verdict": verdict, "kept": verdict == "keep", "ratio": ratio,
                           "ci_low": ratio * 0.98, "ci_high": ratio * 1.02, "quality_passed": True, "rule": None,
                           "agent": "test", "finished_at": t})
    view["measured_config_keys"].append(config_key(cfg))
    view["proposals"].append(proposal["changes"])
    if verdict == "keep":
        view["stack"] = cfg


VIEWS = {
    "synthetic-fresh": lambda: (make_view(SYNTHETIC_KNOBS), SYNTHETIC_KNOBS),
    "engine-fresh-cpu": lambda: (make_view(ENGINE_KNOBS), ENGINE_KNOBS),
    "engine-pinned-dtype": lambda: (make_view(ENGINE_KNOBS, pinned={"dtype": "float32"}), ENGINE_KNOBS),
    "engine-cuda": lambda: (make_view(ENGINE_KNOBS, device="cuda"), ENGINE_KNOBS),
}


# ------------------------------------------------------------------ orchestrator
@pytest.fixture(params=ORCHESTRATORS)
def make_orchestrator(request):
    return request.param


class TestOrchestratorConformance:
    def test_is_an_orchestrator(self, make_orchestrator):
        o = make_orchestrator(0)
        assert isinstance(o, Orchestrator) and isinstance(o.name, str) and o.name.strip()

    @pytest.mark.parametrize("view_name", list(VIEWS))
    def test_proposal_is_admitted_by_the_framework_allowlist(self, make_orchestrator, view_name):
        view, knobs = VIEWS[view_name]()
        raw = make_orchestrator(0).propose(view)
        assert isinstance(raw, dict) and raw.get("action") in ACTIONS, raw
        assert raw["action"] in PHASE_ALLOWLIST["FRAMEWORK"], raw
        proposal, rule, why = validate_proposal(raw, "FRAMEWORK", view, knobs)
        assert rule is None, f"{rule}: {why} ({raw})"
        assert isinstance(raw.get("rationale"), str) and raw["rationale"].strip()
        if raw["action"] == "try_config":
            pg = raw.get("predicted_gain")
            assert pg is None or (isinstance(pg, (int, float)) and math.isfinite(pg)), raw
            assert raw.get("source") in ("prior", "search", "llm"), raw
            assert not set(raw["changes"]) & set(view["pinned"])

    def test_every_tick_of_a_session_is_admitted_and_never_remeasures(self, make_orchestrator):
        view, knobs = make_view(SYNTHETIC_KNOBS), SYNTHETIC_KNOBS
        o = make_orchestrator(3)
        verdicts = ["keep", "revert", "inconclusive", "failed", "reject-quality", "revert"]
        for tick in range(8):
            raw = o.propose(view)
            proposal, rule, why = validate_proposal(raw, "FRAMEWORK", view, knobs)
            assert rule is None, f"tick {tick}: {rule}: {why} ({raw})"
            if proposal["action"] != "try_config":
                break
            verdict = verdicts[tick % len(verdicts)]
            record(view, proposal, verdict, 1.2 if verdict == "keep" else 0.9, 1000.0 + tick)

    def test_ends_the_phase_when_nothing_is_left(self, make_orchestrator):
        every = {k.name: k.default for k in ENGINE_KNOBS}
        pinned = make_view(ENGINE_KNOBS, pinned=every)  # nothing it may change
        assert make_orchestrator(0).propose(pinned)["action"] == "end_phase"
        knob = [Knob("flag", "bool", False, "a switch")]  # both of its values measured
        view = make_view(knob)
        view["measured_config_keys"].append(config_key(resolve_config(knob, {"flag": True})))
        raw = make_orchestrator(0).propose(view)
        assert raw["action"] == "end_phase", raw
        assert validate_proposal(raw, "FRAMEWORK", view, knob)[1] is None

    @pytest.mark.parametrize("view_name", list(VIEWS))
    def test_deterministic_for_a_seed_and_leaves_the_view_alone(self, make_orchestrator, view_name):
        view, _ = VIEWS[view_name]()
        before = copy.deepcopy(view)
        o = make_orchestrator(5)
        first = _same(o.propose(view))
        assert view == before
        assert _same(o.propose(view)) == first
        assert _same(make_orchestrator(5).propose(copy.deepcopy(view))) == first


# ------------------------------------------------------------------ critic
CLEAR_WIN = {"changes": {"micro_batch": 4}, "protocol_verdict": "keep", "ratio": 1.30, "ci_low": 1.20,
             "ci_high": 1.40, "n_pairs": 10, "quality_passed": True, "quality_failed": [], "noise_floor": 0.02,
             "error": None}


def supported(ev: dict[str, Any]) -> bool:
    """What the coordinator admits as a keep (phases' execute_trial: the session's keep rule)."""
    return session_keep(protocol_verdict=ev.get("protocol_verdict"), quality_passed=ev.get("quality_passed"),
                        ci_low=ev.get("ci_low"), min_gain=float(ev.get("min_gain") or 0.0),
                        floor=float(ev.get("noise_floor") or 0))


def unsupported_evidence() -> list[dict[str, Any]]:
    """Evidence the coordinator would not keep on, then malformed evidence
    (which the critic reverts, fail-closed, whatever the rest says)."""
    out = [{**CLEAR_WIN, "protocol_verdict": v} for v in ("revert", "inconclusive", "failed", None, "maybe")]
    out += [{**CLEAR_WIN, "quality_passed": False, "quality_failed": ["eval.nll"]}, {**CLEAR_WIN, "quality_passed": None}]
    out += [{**CLEAR_WIN, "ci_low": 1.01}, {**CLEAR_WIN, "ci_low": 0.97, "ratio": 1.05},
            {**CLEAR_WIN, "noise_floor": 0.25}, {**CLEAR_WIN, "error": "server died", "protocol_verdict": "failed"},
            {**CLEAR_WIN, "ci_low": 1.03, "noise_floor": 0.02, "min_gain": 0.01}]  # clears each, not both together
    assert not any(supported(ev) for ev in out)
    # malformed: the critic reverts it, it does not raise
    out += [{}, {**CLEAR_WIN, "ratio": None}, {**CLEAR_WIN, "ci_low": float("nan")}, {**CLEAR_WIN, "ci_low": "high"},
            {k: v for k, v in CLEAR_WIN.items() if k != "ci_high"}]
    return out


@pytest.fixture(params=CRITICS)
def make_critic(request):
    return request.param


def _ruling(r: Any) -> str:
    assert isinstance(r, dict) and r.get("decision") in ("keep", "revert"), r
    assert isinstance(r.get("lesson"), str) and r["lesson"].strip() and "\n" not in r["lesson"], r
    return r["decision"]


class TestCriticConformance:
    def test_is_a_critic(self, make_critic):
        c = make_critic()
        assert isinstance(c, Critic) and isinstance(c.name, str) and c.name.strip()

    def test_keeps_a_clear_win(self, make_critic):
        assert _ruling(make_critic().judge(dict(CLEAR_WIN))) == "keep"

    @pytest.mark.parametrize("i", range(len(unsupported_evidence())))
    def test_never_keeps_what_the_evidence_does_not_support(self, make_critic, i):
        ev = unsupported_evidence()[i]
        assert _ruling(make_critic().judge(ev)) == "revert", ev

    def test_keep_only_when_supported_over_a_grid(self, make_critic):
        for verdict in ("keep", "revert", "inconclusive"):
            for quality in (True, False, None):
                for lo in (0.95, 1.0, 1.019, 1.021, 1.1):
                    for floor in (0.0, 0.02, 0.2):
                        ev = {**CLEAR_WIN, "protocol_verdict": verdict, "quality_passed": quality, "ci_low": lo,
                              "ratio": max(lo, 1.0) + 0.05, "ci_high": max(lo, 1.0) + 0.1, "noise_floor": floor}
                        if _ruling(make_critic().judge(ev)) == "keep":
                            assert supported(ev), ev

    def test_deterministic_and_leaves_the_evidence_alone(self, make_critic):
        for ev in [dict(CLEAR_WIN)] + unsupported_evidence():
            before = json.dumps(ev, sort_keys=True)  # (NaN != NaN: compared as text)
            first = _same(make_critic().judge(ev))
            assert json.dumps(ev, sort_keys=True) == before
            assert _same(make_critic().judge(ev)) == first


# ------------------------------------------------------------------ LLM transports
def test_every_llm_transport_is_a_transport(tmp_path):
    """The SDK transports and the replay transport fit the Transport Protocol (send -> Reply or LLMRefusal)."""
    from inferloom.agents.llm_client import AnthropicTransport, OpenAITransport
    from inferloom.agents.llm_record import EXCHANGES

    (tmp_path / EXCHANGES).parent.mkdir()
    (tmp_path / EXCHANGES).write_text(json.dumps({"role": "orchestrator", "reply": "{}", "input_tokens": 1}) + "\n")
    made = [AnthropicTransport("m", "k", base_url="http://127.0.0.1:9", timeout_s=1, max_retries=0, temperature=None),
            OpenAITransport("m", "k", base_url="http://127.0.0.1:9/v1", timeout_s=1, max_retries=0, temperature=0.5),
            ReplayTransport(tmp_path), _AnswerTransport(dict)]
    for t in made:
        assert isinstance(t, Transport) and t.name
    assert made[2].send("orchestrator", "s", [], {}, "X", 10) == Reply("{}", 1, 0, None)


# ------------------------------------------------------------------ robustness
def _trial(verdict: str, t: float, cycle: int = 1) -> dict[str, Any]:
    return {"changes": {"micro_batch": int(t) % 7 + 1}, "verdict": verdict, "ratio": 1.0, "cycle": cycle,
            "finished_at": t}


HEALTHY = {"cycle": 1, "started_at": 1000.0, "cycle_started_at": 1000.0,
           "trials": [_trial("keep", 1010.0), _trial("revert", 1020.0), _trial("keep", 1030.0)],
           "proposals": [{"micro_batch": 2}, {"micro_batch": 3}, {"micro_batch": 4}]}
TRIPS = {
    "many-failures": {**HEALTHY, "trials": HEALTHY["trials"] + [_trial("failed", 1040.0 + i) for i in range(12)]},
    "repeated-proposal": {**HEALTHY, "proposals": HEALTHY["proposals"] + [{"micro_batch": 8}, {"micro_batch": 8}]},
    "no-progress-for-days": {**HEALTHY, "now": 1030.0 + 7 * 86400.0},
}


@pytest.fixture(params=ROBUSTNESS)
def make_robustness(request):
    return request.param


def _forced(r: Any) -> None:
    assert isinstance(r, dict) and r.get("action") in ("end_phase", "stop"), r
    assert isinstance(r.get("rule"), str) and r["rule"].strip() and isinstance(r.get("reason"), str), r


class TestRobustnessConformance:
    def test_is_a_robustness(self, make_robustness):
        r = make_robustness()
        assert isinstance(r, Robustness) and isinstance(r.name, str) and r.name.strip()

    def test_all_is_well(self, make_robustness):
        assert make_robustness().check(json.loads(json.dumps(HEALTHY)), 1035.0) is None
        fresh = {"cycle": 1, "started_at": 1000.0, "trials": [], "proposals": []}
        assert make_robustness().check(fresh, 1000.0) is None

    @pytest.mark.parametrize("name", list(TRIPS))
    def test_trips_with_end_phase_or_stop(self, make_robustness, name):
        state = json.loads(json.dumps({k: v for k, v in TRIPS[name].items() if k != "now"}))
        _forced(make_robustness().check(state, TRIPS[name].get("now", 1045.0 + 12)))

    @pytest.mark.parametrize("name", ["healthy"] + list(TRIPS))
    def test_deterministic_and_leaves_the_state_alone(self, make_robustness, name):
        raw = HEALTHY if name == "healthy" else TRIPS[name]
        state = json.loads(json.dumps({k: v for k, v in raw.items() if k != "now"}))
        before = copy.deepcopy(state)
        now = raw.get("now", 1060.0)
        first = make_robustness().check(state, now)
        assert state == before and make_robustness().check(state, now) == first


# ------------------------------------------------------------------ patch critic
GOOD_PATCH = {"id": "p1", "title": "faster tokenizer", "hypothesis": "src/tok.py caches the vocabulary lookup",
              "paths": ["src/tok.py"], "diff": {}}
REFUSED = {
    "no-hypothesis": {**GOOD_PATCH, "hypothesis": ""},
    "path-outside-hypothesis": {**GOOD_PATCH, "paths": ["src/tok.py", "src/other.py"]},
    "empty-evidence": {},
    "no-paths": {**GOOD_PATCH, "paths": []},
    "paths-missing": {k: v for k, v in GOOD_PATCH.items() if k != "paths"},
    "paths-a-string": {**GOOD_PATCH, "paths": "src/tok.py"},
    "paths-not-strings": {**GOOD_PATCH, "paths": [None, 3]},
}


@pytest.fixture(params=PATCH_CRITICS)
def make_patch_critic(request):
    return request.param


def _review(r: Any) -> str:
    assert isinstance(r, dict) and r.get("decision") in ("sign_off", "refuse"), r
    assert isinstance(r.get("why"), str) and r["why"].strip(), r
    if r["decision"] == "refuse":
        assert isinstance(r.get("rule"), str) and r["rule"].strip(), r
    return r["decision"]


class TestPatchCriticConformance:
    def test_is_a_patch_critic(self, make_patch_critic):
        c = make_patch_critic()
        assert isinstance(c, PatchCritic) and isinstance(c.name, str) and c.name.strip()

    def test_signs_off_a_patch_its_hypothesis_covers(self, make_patch_critic):
        assert _review(make_patch_critic().review(dict(GOOD_PATCH))) == "sign_off"

    @pytest.mark.parametrize("name", list(REFUSED))
    def test_fail_closed(self, make_patch_critic, name):
        assert _review(make_patch_critic().review(copy.deepcopy(REFUSED[name]))) == "refuse"

    @pytest.mark.parametrize("name", ["good"] + list(REFUSED))
    def test_deterministic_and_leaves_the_evidence_alone(self, make_patch_critic, name):
        ev = copy.deepcopy(GOOD_PATCH if name == "good" else REFUSED[name])
        before = copy.deepcopy(ev)
        first = make_patch_critic().review(ev)
        assert ev == before and make_patch_critic().review(ev) == first


# ------------------------------------------------------------------ patch source
@pytest.fixture(params=SOURCES)
def source_case(request):
    return request.param


def _well_formed(c: Any) -> None:
    assert isinstance(c, PatchCandidate), c
    assert isinstance(c.id, str) and c.id.strip() and isinstance(c.data, bytes) and c.data
    assert isinstance(c.title, str) and c.title.strip() and isinstance(c.hypothesis, str)
    assert c.expected_gain is None or (isinstance(c.expected_gain, float) and math.isfinite(c.expected_gain))
    assert isinstance(c.origin, str) and c.origin
    json.dumps(c.summary())


class TestPatchSourceConformance:
    def test_is_a_patch_source(self, source_case, tmp_path):
        s = source_case.make(tmp_path)
        assert isinstance(s, PatchSource) and isinstance(s.name, str) and s.name.strip()

    def test_gives_unseen_candidates_until_it_has_none(self, source_case, tmp_path):
        s = source_case.make(tmp_path)
        state: dict[str, Any] = {"patches_seen": []}
        for _ in range(20):
            before = copy.deepcopy(state)
            c = s.next_patch(state)
            assert state == before
            if c is None:
                break
            _well_formed(c)
            assert c.id not in state["patches_seen"]
            state["patches_seen"].append(c.id)
        else:
            pytest.fail("the source never ran out")
        assert len(state["patches_seen"]) >= 2
        assert s.next_patch(state) is None

    def test_same_state_same_candidate(self, source_case, tmp_path):
        s = source_case.make(tmp_path)
        a, b = s.next_patch({"patches_seen": []}), s.next_patch({"patches_seen": []})
        assert (a.id, a.sha256, a.title) == (b.id, b.sha256, b.title)

    def test_never_gives_an_id_already_seen(self, source_case, tmp_path):
        s = source_case.make(tmp_path)
        first = s.next_patch({"patches_seen": []})
        # another source's candidates may be in patches_seen too, under any id
        seen = ["specialist-02", "02-header", "unrelated"]
        c = s.next_patch({"patches_seen": seen})
        assert c is not None and c.id not in seen and first is not None

    def test_a_failure_is_a_patch_source_error(self, source_case, tmp_path):
        if source_case.broken is None:
            pytest.skip("no failure case for this source")
        with pytest.raises(PatchSourceError):
            source_case.broken(tmp_path).next_patch({"patches_seen": []})
