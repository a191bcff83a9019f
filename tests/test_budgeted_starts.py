"""A server start inside a session's trial is bounded by the budget left (workloads/server_start.py's
``budgeted_timeout``, the ``BudgetedStarts`` hook, phases/trial.py's ``budgeted_starts``). On one H100
(2026-12-06) a trial begun with 1.9 minutes left waited the spec's 600 s start-up timeout for one server,
and a 12-minute session took 20.4."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from inferloom.agents.rules import RuleCritic, RuleOrchestrator, RuleRobustness
from inferloom.phases.runner import start
from inferloom.phases.trial import budgeted_starts
from inferloom.spec import load_spec
from inferloom.workloads import server_start
from inferloom.workloads.base import AdapterError, BudgetedStarts, Knob
from inferloom.workloads.server_start import START_FLOOR_S, budgeted_timeout
from inferloom.workloads.synthetic import SyntheticAdapter
from inferloom.workloads.vllm_adapter import VLLMAdapter


def test_the_timeout_is_the_budget_left_with_a_floor_and_never_above_the_spec():
    assert budgeted_timeout(600.0, None) == (600.0, False)  # no session: the spec's
    assert budgeted_timeout(600.0, lambda: None) == (600.0, False)
    assert budgeted_timeout(600.0, lambda: 900.0) == (600.0, False)  # more left than the spec allows
    assert budgeted_timeout(600.0, lambda: 300.0) == (300.0, True)
    assert budgeted_timeout(600.0, lambda: 114.0) == (START_FLOOR_S, True)  # the H100 trial's 1.9 minutes
    assert budgeted_timeout(600.0, lambda: -50.0) == (START_FLOOR_S, True)  # spent: a normal start still fits
    assert budgeted_timeout(90.0, lambda: 10.0) == (90.0, False)  # the floor never raises the spec's


def _never_healthy_python(d: Path) -> str:
    """An executable standing in for the server environment's Python: a version for ``-c``, no help (the
    static knob table stands), and as a server it runs on without ever answering /health."""
    script = d / "python"
    script.write_text('#!/bin/sh\nif [ "$1" = "-c" ]; then echo "vllm 0.0.fake"; exit 0; fi\n'
                      'case "$3" in --help*) exit 2;; esac\necho "fake server: loading" >&2\nexec sleep 120\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def _adapter(tmp_path: Path, timeout_s: float) -> VLLMAdapter:
    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "m" / "config.json").write_text(json.dumps({"vocab_size": 500}))
    spec = load_spec(None, {"framework": "vllm", "device": "cpu", "model": str(tmp_path / "m"),
                            "serving.python": _never_healthy_python(tmp_path),
                            "serving.startup_timeout_s": timeout_s})
    return VLLMAdapter(spec, tmp_path / "logs")


def test_a_real_server_process_cut_by_the_budget_fails_with_kind_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(server_start, "START_FLOOR_S", 1.0)
    said: list[str] = []
    a = _adapter(tmp_path, timeout_s=60)
    assert isinstance(a, BudgetedStarts) and a.start_budget is None
    a.set_log_dir(tmp_path / "servers", progress=said.append)
    try:
        a.start_budget = lambda: 2.0  # what a session's trial sets: the seconds left
        t0 = time.perf_counter()
        with pytest.raises(AdapterError) as ei:
            a.prepare({})
        took = time.perf_counter() - t0
        assert ei.value.kind == "budget", ei.value
        assert "cut by the budget, not a verdict on the configuration" in str(ei.value)
        assert "(serving.startup_timeout_s: 60 s)" in str(ei.value)
        assert took < 30, took  # the spec's 60 s were not waited
        assert any("start-up cut at 2 s: the session's budget is nearly used" in s for s in said), said
        # outside a session's trial the spec's timeout stands: a start that times out is startup_timeout
        a.start_budget = None
        (tmp_path / "b").mkdir()
        b = _adapter(tmp_path / "b", timeout_s=2)
        with pytest.raises(AdapterError) as ei:
            b.prepare({})
        assert ei.value.kind == "startup_timeout"
        b.close()
    finally:
        a.close()


class _Starts(SyntheticAdapter):
    """The synthetic adapter with the hook: it records what ``start_budget`` says at each prepare."""

    start_budget = None

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen: list[float | None] = []

    def prepare(self, config):
        self.seen.append(self.start_budget() if self.start_budget is not None else None)
        return super().prepare(config)


def _one_trial_session(d: Path, cls: type) -> SyntheticAdapter:
    """A synthetic session of one trial (``fast_path=True``) with the adapter ``cls``; returns the adapter."""
    spec = load_spec(None, {"model": "llama-tiny", "framework": "synthetic", "device": "cpu",
                            "quality.eval_prompts": 4, "quality.heldout_prompts": 4,
                            "quality.prompt_len": 8, "quality.continuation_len": 8})
    a = cls(effects={"fast_path": {True: 1.2}}, numerics={}, knobs=[Knob("fast_path", "bool", False, "+20%")],
            noise_sd=0.02)
    agents = {"orchestrator": RuleOrchestrator(seed=0), "critic_factory": RuleCritic, "robustness": RuleRobustness()}
    start(d, spec, budget_minutes=10, max_trials=1, adapter=a, agents=agents)
    return a


def test_a_sessions_trials_bound_their_starts_and_prelude_and_close_do_not(tmp_path):
    a = _one_trial_session(tmp_path / "s", _Starts)
    bounded = [s for s in a.seen if s is not None]
    assert bounded, a.seen  # the trial's prepares saw the budget left
    assert all(0 < s <= 600 for s in bounded), bounded
    assert a.seen[0] is None and a.seen[-1] is None  # PRELUDE's stock, CLOSE's final comparison: unbounded
    assert a.start_budget is None  # cleared after the trial


def test_an_adapter_without_the_hook_is_left_alone():
    ctx = SimpleNamespace(adapter=SimpleNamespace(), elapsed_s=lambda st: 0.0)
    with budgeted_starts(ctx, SimpleNamespace(budget=SimpleNamespace(minutes=1))):
        assert not hasattr(ctx.adapter, "start_budget")
    ctx = SimpleNamespace(adapter=SimpleNamespace(start_budget=None), elapsed_s=lambda st: 45.0)
    with pytest.raises(RuntimeError):
        with budgeted_starts(ctx, SimpleNamespace(budget=SimpleNamespace(minutes=1))):
            assert ctx.adapter.start_budget() == 15.0
            raise RuntimeError("a measurement that fails")
    assert ctx.adapter.start_budget is None  # cleared on the way out, whatever happened


class _Cut(SyntheticAdapter):
    """A start the budget cuts for the candidate, as server_start raises it."""

    start_budget = None

    def prepare(self, config):
        if config.get("fast_path"):
            raise AdapterError("synthetic server for 03 was not healthy within the 120 s the session's budget left "
                               "its start: cut by the budget, not a verdict on the configuration", kind="budget")
        return super().prepare(config)


def test_a_trial_the_budget_cut_is_failed_in_the_report_and_not_learned_as_a_failure(tmp_path):
    from inferloom.kb.recipe import failures_from_breakdown

    _one_trial_session(tmp_path / "s", _Cut)
    b = json.loads((tmp_path / "s" / "session_breakdown.json").read_text())
    [rej] = b["rejected"]
    assert rej["changes"] == {"fast_path": True} and rej["outcome"] == "failed" and rej["error_kind"] == "budget"
    assert "cut by the budget" in (tmp_path / "s" / "report.md").read_text()
    assert failures_from_breakdown(b, "s", 0.0) == []  # the KB learns no failure of fast_path from it
    rej.pop("error_kind")  # the same trial failed for another reason is learned
    assert [f["changes"] for f in failures_from_breakdown(b, "s", 0.0)] == [{"fast_path": True}]
