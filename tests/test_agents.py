"""The deterministic default agents (agents/rules.py, agents/priors.py)."""

from __future__ import annotations

import copy
import hashlib
import json
import math

import pytest

from inferloom.agents.base import Critic, Orchestrator, Robustness
from inferloom.agents.priors import DEFAULT_PRIORS, Prior, rank_priors
from inferloom.agents.rules import RuleCritic, RuleOrchestrator, RuleRobustness, knob_from_dict
from inferloom.workloads.base import Knob, config_key
from inferloom.workloads.synthetic import SYNTHETIC_KNOBS

CPU, CUDA, BOTH = frozenset({"cpu"}), frozenset({"cuda"}), frozenset({"cpu", "cuda"})


def engine_knobs(concurrency: int = 8, dtype: str = "float32") -> list[Knob]:
    """The transformers engine's knob space (names, kinds and domains as in
    TransformersEngine.knob_space(), without building an engine)."""
    return [
        Knob("dtype", "choice", dtype, "", choices=("float32", "bfloat16", "float16"), changes_numerics=True),
        Knob("attn_implementation", "choice", "sdpa", "", choices=("eager", "sdpa"), changes_numerics=True),
        Knob("sdpa_backend", "choice", "auto", "", choices=("auto", "math", "efficient", "flash", "cudnn")),
        Knob("cache_implementation", "choice", "dynamic", "", choices=("dynamic", "static")),
        Knob("compile_mode", "choice", "off", "", choices=("off", "default", "reduce-overhead", "max-autotune")),
        Knob("micro_batch", "int", concurrency, "", low=1, high=concurrency),
        Knob("cpu_threads", "int", 2, "", low=1, high=4, applies_to=CPU),
        Knob("tf32_matmul", "bool", False, "", applies_to=CUDA),
        Knob("prompt_lookup", "int", 0, "", low=0, high=10),
        Knob("decode_loop", "choice", "generate", "", choices=("generate", "static_loop")),
    ]


def make_state(knobs, device="cpu", concurrency=8, dtype="float32", **extra):
    stock = {k.name: k.default for k in knobs}
    state = {
        "phase": "FRAMEWORK", "cycle": 1, "device": device,
        "knobs": [k.to_dict() for k in knobs], "stock_config": dict(stock), "stack": dict(stock),
        "trials": [], "workload": {"concurrency": concurrency, "input_len": 128, "output_len": 64,
                                   "dtype": dtype, "model": "llama-tiny"},
    }
    state.update(extra)
    return json.loads(json.dumps(state))  # exactly what a state.json load gives


def fake_ratio(cfg) -> float:
    h = int(hashlib.sha256(config_key(cfg).encode()).hexdigest()[:8], 16)
    return 0.85 + 0.3 * (h / 0xFFFFFFFF)


def feed(state, proposal, verdict=None, ratio=None, t=0.0):
    """Record a fake measurement of ``proposal`` in ``state`` (keep moves the stack)."""
    cfg = {**state["stack"], **proposal["changes"]}
    ratio = fake_ratio(cfg) if ratio is None else ratio
    verdict = verdict or ("keep" if ratio > 1.1 else "revert" if ratio < 0.95 else "inconclusive")
    state["trials"].append({
        "config": cfg, "changes": proposal["changes"], "verdict": verdict, "ratio": ratio,
        "ci_low": ratio * 0.97, "ci_high": ratio * 1.03, "quality_passed": True,
        "rule": None, "agent": "rule-orchestrator", "finished_at": t, "cycle": state.get("cycle"),
    })
    if verdict == "keep":
        state["stack"] = cfg


def full_config(state, changes):
    return config_key({**state["stack"], **changes})


# ----------------------------------------------------------------- protocols
def test_all_three_satisfy_the_protocols():
    assert isinstance(RuleOrchestrator(), Orchestrator)
    assert isinstance(RuleCritic(), Critic)
    assert isinstance(RuleRobustness(), Robustness)


def test_knob_from_dict_round_trips():
    for k in engine_knobs() + list(SYNTHETIC_KNOBS):
        assert knob_from_dict(json.loads(json.dumps(k.to_dict()))) == k


# -------------------------------------------------------------- orchestrator
def test_priors_first_and_ranked_by_device():
    cuda = RuleOrchestrator().propose(make_state(engine_knobs(64, "bfloat16"), "cuda", 64, "bfloat16"))
    assert cuda["source"] == "prior" and cuda["predicted_gain"] > 0
    assert cuda["changes"] == {"cache_implementation": "static", "compile_mode": "reduce-overhead"}
    big = RuleOrchestrator().propose(make_state(engine_knobs(256, "bfloat16"), "cuda", 256, "bfloat16"))
    assert big["changes"] == {"cache_implementation": "static", "compile_mode": "default"}
    cpu = RuleOrchestrator().propose(make_state(engine_knobs()))
    assert cpu["source"] == "prior" and cpu["changes"] == {"compile_mode": "default"}


def test_once_cuda_graphs_are_kept_the_own_decode_loop_comes_next():
    state = make_state(engine_knobs(64, "bfloat16"), "cuda", 64, "bfloat16")
    state["stack"].update(cache_implementation="static", compile_mode="reduce-overhead")
    nxt = RuleOrchestrator().propose(state)
    assert nxt["source"] == "prior" and nxt["changes"] == {"decode_loop": "static_loop"}
    assert "static-loop+cuda-graphs" in nxt["rationale"]


def test_prior_order_and_dtype_conditions():
    names = [p.name for p in rank_priors("cuda", 8, "bfloat16")]
    assert names.index("static-cache+cuda-graphs") < names.index("compile") < names.index("sdpa-flash")
    assert "tf32" not in names and "bf16" not in names
    fp32 = [p.name for p in rank_priors("cuda", 8, "float32")]
    assert "tf32" in fp32 and fp32[-1] == "bf16" and "sdpa-flash" not in fp32
    assert [p.name for p in rank_priors("cpu", 8, "float32")][0] == "compile"
    assert all(p.predicted_gain >= 0 and p.rationale for p in DEFAULT_PRIORS)


def test_never_repeats_a_measured_config_over_a_long_loop():
    state = make_state(engine_knobs())
    # without the adaptive rules (search_moves.py), the order is plain: priors, then one knob at a time
    orch = RuleOrchestrator(seed=3, prior_patience=None, stall=None)
    seen, sources = {config_key(state["stock_config"])}, []
    for i in range(30):
        p = orch.propose(state)
        assert p["action"] == "try_config", p
        key = full_config(state, p["changes"])
        assert key not in seen, (i, p)
        assert p["changes"] and all(state["stack"][k] != v for k, v in p["changes"].items())
        seen.add(key)
        sources.append(p["source"])
        feed(state, p)
    # the CPU priors come first; after a keep, priors apply again to the new stack; then the search
    first_search = sources.index("search")
    assert first_search >= 6 and set(sources[:first_search]) == {"prior"}
    searched = [t["changes"] for t, s in zip(state["trials"], sources) if s == "search"]
    assert searched and all(len(c) == 1 for c in searched)  # max_changes=1 by default


TINY = [Knob("a", "bool", False, ""), Knob("b", "bool", False, ""),
        Knob("c", "choice", "x", "", choices=("x", "y", "z"))]


@pytest.mark.parametrize("max_changes, expected", [(None, 2 * 2 * 3 - 1), (1, 1 + 1 + 2), (2, 1 + 1 + 2 + 1 + 2 + 2)])
def test_tiny_space_is_exhausted_then_end_phase(max_changes, expected):
    state, seen, ended = make_state(TINY), set(), None
    for _ in range(30):
        p = RuleOrchestrator(max_changes=max_changes).propose(state)
        if p["action"] == "end_phase":
            ended = p
            break
        key = full_config(state, p["changes"])
        assert key not in seen
        seen.add(key)
        feed(state, p, verdict="revert", ratio=0.9)
    assert ended is not None and "exhausted" in ended["rationale"]
    assert len(seen) == expected  # every configuration (within max_changes of stock) but stock


def test_deterministic():
    state = make_state(engine_knobs())
    for _ in range(12):  # past the priors, into TPE
        feed(state, RuleOrchestrator().propose(state), verdict="revert", ratio=0.9)
    snapshot = copy.deepcopy(state)
    a, b = RuleOrchestrator().propose(state), RuleOrchestrator().propose(copy.deepcopy(state))
    assert a == b and a["source"] == "search" and state == snapshot  # state not mutated


def test_pinned_knobs_never_change():
    state = make_state(engine_knobs(), pinned={"compile_mode": "off", "cache_implementation": "dynamic"})
    for _ in range(20):
        p = RuleOrchestrator().propose(state)
        if p["action"] != "try_config":
            break
        assert not {"compile_mode", "cache_implementation"} & set(p["changes"])
        feed(state, p)
    assert state["trials"]


def test_inapplicable_knobs_never_proposed():
    for device, absent in (("cpu", "tf32_matmul"), ("cuda", "cpu_threads")):
        state = make_state(engine_knobs(), device)
        for _ in range(20):
            p = RuleOrchestrator().propose(state)
            assert absent not in p["changes"]
            feed(state, p)


def test_past_failures_rank_down_but_do_not_ban():
    failures = [{"compile_mode": "default"}]
    state = make_state(engine_knobs(), kb_failures=failures)
    first = RuleOrchestrator(prior_patience=None).propose(state)
    # both compile priors contain the failed change: the first clean prior goes first
    assert first["changes"] == {"cache_implementation": "static"}
    proposed = []
    for _ in range(8):
        p = RuleOrchestrator(prior_patience=None).propose(state)
        if p["source"] != "prior":
            break
        proposed.append(p)
        feed(state, p, verdict="revert", ratio=0.9)
    demoted = [p for p in proposed if p["changes"].get("compile_mode") == "default"]
    assert demoted and "ranked down" in demoted[0]["rationale"]
    assert proposed.index(demoted[0]) > 0


def test_priors_skip_unknown_knobs_and_measured_configs():
    table = [Prior("ghost", {"no_such_knob": 1}, 0.1, "x", BOTH, 1),
             Prior("bad-value", {"compile_mode": "turbo"}, 0.1, "x", BOTH, 2),
             Prior("ok", {"compile_mode": "default"}, 0.1, "x", BOTH, 3),
             {"name": "as-dict", "changes": {"cpu_threads": "max"}, "rank": 4}]
    state = make_state(engine_knobs())
    p = RuleOrchestrator(prior_table=table, prior_patience=None).propose(state)
    assert p["changes"] == {"compile_mode": "default"}
    feed(state, p, verdict="revert", ratio=0.9)
    p = RuleOrchestrator(prior_table=table, prior_patience=None).propose(state)
    assert p["changes"] == {"cpu_threads": 4} and p["source"] == "prior"
    feed(state, p, verdict="revert", ratio=0.9)
    assert RuleOrchestrator(prior_table=table, prior_patience=None).propose(state)["source"] == "search"


def test_tpe_used_after_priors():
    """No prior names a synthetic knob: TPE drives from the first call; its
    samples are the ones proposed (not the enumeration fallback)."""
    state = make_state(list(SYNTHETIC_KNOBS))
    p = RuleOrchestrator(search="tpe").propose(state)
    assert p["source"] == "search" and p["predicted_gain"] is None and "TPE sample" in p["rationale"]
    wide = RuleOrchestrator(max_changes=None).propose(make_state(engine_knobs()))
    assert wide["source"] == "prior"


def test_tpe_steers_toward_the_good_knob():
    """Synthetic truth: fast_path +20%, everything else 0% or worse. Past the
    startup trials, TPE's samples favour fast_path=True."""
    knobs = [Knob("fast_path", "bool", False, ""), Knob("junk", "int", 0, "", low=0, high=30),
             Knob("mode", "choice", "a", "", choices=tuple("abcde"))]
    state = make_state(knobs)
    orch = RuleOrchestrator(max_changes=None, n_startup_trials=3, search="tpe")
    picks = []
    for _ in range(15):
        p = orch.propose(state)
        if p["action"] != "try_config":
            break
        cfg = {**state["stack"], **p["changes"]}
        picks.append(cfg["fast_path"])
        feed(state, p, verdict="revert", ratio=1.2 if cfg["fast_path"] else 0.95)
    assert len(picks) == 15 and sum(picks[3:]) >= 8, picks  # random: 6 of 12 expected


def test_history_objective_is_cumulative_over_keeps():
    orch = RuleOrchestrator()
    state = make_state(list(SYNTHETIC_KNOBS))
    feed(state, {"changes": {"fast_path": True}}, verdict="keep", ratio=1.2)
    feed(state, {"changes": {"useless": True}}, verdict="revert", ratio=0.9)
    feed(state, {"changes": {"approx_math": True}}, verdict="reject-quality", ratio=1.4)
    from inferloom.agents.rules import SearchView

    values = [v for _, v in orch._history(SearchView(state))]
    assert values == pytest.approx([math.log(1.2), math.log(1.2) + math.log(0.9), math.log(1.2) + math.log(0.5)])


def test_other_phase_still_proposes_and_no_knobs_ends():
    state = make_state(engine_knobs(), phase="SWEEP")
    assert RuleOrchestrator().propose(state)["action"] == "try_config"
    state = make_state([Knob("t", "bool", False, "", applies_to=CUDA)])
    assert RuleOrchestrator().propose(state)["action"] == "end_phase"


# -------------------------------------------------------------------- critic
def ev(**kw):
    base = {"changes": {"compile_mode": "default"}, "protocol_verdict": "keep", "ratio": 1.395,
            "ci_low": 1.264, "ci_high": 1.541, "n_pairs": 5, "quality_passed": True,
            "quality_failed": [], "noise_floor": 0.03}
    base.update(kw)
    return base


def test_critic_keeps_proven_gain():
    out = RuleCritic().judge(ev())
    assert out == {"decision": "keep",
                   "lesson": "compile_mode=default: +39.5% [+26.4%, +54.1%] over 5 pairs, quality passed: kept"}


@pytest.mark.parametrize("kw, words", [
    ({"protocol_verdict": "revert", "ratio": 0.93, "ci_low": 0.903, "ci_high": 0.959, "n_pairs": 7,
      "changes": {"cache_implementation": "static"}},
     ["cache_implementation=static: -7.0% [-9.7%, -4.1%] over 7 pairs", "reverted (slower)"]),
    ({"protocol_verdict": "revert", "ratio": 1.0107, "ci_low": 0.8812, "ci_high": 1.1591, "n_pairs": 3,
      "changes": {"async_scheduling": True},  # the H200 vLLM session of 2026-12-01 said "(slower)" here
      "protocol_reason": "revert (futility): a gain of +3.8% is out of reach after 3 pairs"},
     ["+1.1% [-11.9%, +15.9%] over 3 pairs", "reverted (a gain worth keeping is out of reach: futility)"]),
    ({"quality_passed": False, "quality_failed": ["greedy_agreement 0.57 < 0.8"]},
     ["faster but failed quality (greedy_agreement 0.57 < 0.8): reverted"]),
    ({"protocol_verdict": "inconclusive", "ratio": 1.01, "ci_low": 0.98, "ci_high": 1.04, "n_pairs": 15},
     ["inconclusive after 15 pairs: reverted"]),
    ({"ci_low": 1.02}, ["does not clear the noise floor 3.0%", "reverted"]),
    ({"quality_passed": None}, ["no quality verdict: reverted"]),
    ({"ratio": None}, ["no usable ratio", "reverted"]),
    ({"noise_floor": {"sd": 0.1}}, ["reverted"]),
    ({"protocol_verdict": "failed"}, ["protocol verdict failed: reverted"]),
    ({"protocol_verdict": "failed", "ratio": None, "error": "AdapterError: needs static\ntrace"},
     ["protocol verdict failed (AdapterError: needs static)", "reverted"]),
])
def test_critic_reverts(kw, words):
    out = RuleCritic().judge(ev(**kw))
    assert out["decision"] == "revert"
    assert "\n" not in out["lesson"] and all(w in out["lesson"] for w in words), out["lesson"]


def test_critic_unscored_keep_only_when_allowed():
    out = RuleCritic(allow_unscored=True).judge(ev(quality_passed=None, changes={"cpu_threads": 4}))
    assert out["decision"] == "keep" and "unscored" in out["lesson"]
    assert RuleCritic(allow_unscored=True).judge(ev(quality_passed=False))["decision"] == "revert"


# ---------------------------------------------------------------- robustness
def rstate(verdicts, proposals=(), started_at=0.0, cycle=1):
    trials = [{"verdict": v, "finished_at": 60.0 * (i + 1), "cycle": cycle, "config": {}} for i, v in enumerate(verdicts)]
    return {"trials": trials, "proposals": list(proposals), "started_at": started_at, "cycle": cycle}


def test_robustness_consecutive_failures():
    r = RuleRobustness(max_consecutive_failures=3)
    out = r.check(rstate(["keep", "failed", "failed", "failed"]), now=300.0)
    assert out["action"] == "end_phase" and out["rule"] == "consecutive_failures"
    assert r.check(rstate(["failed", "failed", "keep", "failed"]), now=300.0) is None
    assert RuleRobustness(max_consecutive_failures=4).check(rstate(["keep"] + ["failed"] * 3), now=300.0) is None
    # a new cycle starts with a clean slate
    s = rstate(["failed"] * 3)
    s["cycle"] = 2
    assert r.check(s, now=300.0) is None


def test_robustness_repeated_proposal():
    r = RuleRobustness()
    a, b = {"compile_mode": "default"}, {"cache_implementation": "static"}
    assert r.check(rstate(["keep"], [a, b, {"cache_implementation": "static"}]), now=120.0)["rule"] == "repeated_proposal"
    assert r.check(rstate(["keep"], [a, b, a]), now=120.0) is None
    wrapped = [{"action": "try_config", "changes": a}] * 2
    assert r.check(rstate(["keep"], wrapped), now=120.0)["rule"] == "repeated_proposal"


def test_robustness_no_progress():
    r = RuleRobustness(stall_minutes=30.0)
    s = rstate(["keep", "revert", "revert"], started_at=0.0)  # keep finished at 60 s
    assert r.check(s, now=60.0 + 29 * 60) is None
    out = r.check(s, now=60.0 + 31 * 60)
    assert out["rule"] == "no_progress" and out["action"] == "end_phase"
    assert r.check(rstate([], started_at=1000.0), now=1000.0 + 10 * 60) is None
    assert RuleRobustness(stall_minutes=5).check(rstate([], started_at=1000.0), now=1000.0 + 10 * 60)["rule"] == "no_progress"


def test_robustness_validates_thresholds():
    with pytest.raises(ValueError):
        RuleRobustness(max_consecutive_failures=0)


def test_public_api_pinned():
    from inferloom.agents import priors, rules

    assert set(rules.__all__) == {"RuleOrchestrator", "RuleCritic", "RuleRobustness", "knob_from_dict"}
    assert set(priors.__all__) == {"Prior", "DEFAULT_PRIORS", "rank_priors"}


def test_trials_without_config_are_replayed_from_changes():
    state = make_state(TINY)
    state["trials"] = [{"changes": {"a": True}, "verdict": "keep", "ratio": 1.2},
                       {"changes": {"b": True}, "verdict": "revert", "ratio": 0.9}]
    state["stack"] = {**state["stock_config"], "a": True}
    measured = {config_key({**state["stock_config"], "a": True, "b": True})}
    for _ in range(8):
        p = RuleOrchestrator(max_changes=None).propose(state)
        if p["action"] != "try_config":
            break
        key = full_config(state, p["changes"])
        assert key not in measured
        measured.add(key)
        feed(state, p, verdict="revert", ratio=0.9)


def test_unbounded_int_knob_is_not_searched():
    knobs = [Knob("n", "int", 4, ""), Knob("a", "bool", False, "")]
    state = make_state(knobs)
    p = RuleOrchestrator().propose(state)
    assert p["changes"] == {"a": True}
    feed(state, p, verdict="revert", ratio=0.9)
    assert RuleOrchestrator().propose(state)["action"] == "end_phase"


def test_search_without_optuna_falls_back_to_enumeration(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_optuna(name, *a, **kw):
        if name == "optuna" or name.startswith("optuna."):
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_optuna)
    p = RuleOrchestrator(search="tpe").propose(make_state(TINY))
    assert p["source"] == "search" and "optuna is not installed" in p["rationale"] and p["changes"] == {"a": True}


def test_known_cross_knob_rules_cost_no_trial():
    """With ``feasible`` (the engine's cross-knob rules), no proposal is one they refuse: priors,
    TPE samples and the enumeration all skip it, until the feasible space is exhausted."""
    def feasible(cfg):  # as the engine: prompt_lookup needs micro_batch=1; static_loop needs the static cache
        return not ((cfg["prompt_lookup"] > 0 and cfg["micro_batch"] != 1)
                    or (cfg["decode_loop"] == "static_loop" and cfg["cache_implementation"] != "static"))

    state = make_state(engine_knobs(concurrency=2))
    orch, refused = RuleOrchestrator(seed=1, feasible=feasible), 0
    blind = RuleOrchestrator(seed=1, search="ucb")  # the same search as orch, without the rules
    for _ in range(40):
        b = blind.propose(state)
        refused += b["action"] == "try_config" and not feasible({**state["stack"], **b["changes"]})
        p = orch.propose(state)
        if p["action"] != "try_config":
            break
        assert feasible({**state["stack"], **p["changes"]}), p
        feed(state, p)
    assert refused > 0  # without the rules, the same search proposes configurations the engine refuses
