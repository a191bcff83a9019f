"""The enablement ladder with classified failures (no server needed)."""

from inferloom.agents.rules import RuleCritic, RuleOrchestrator, RuleRobustness
from inferloom.session import ledger as L
from inferloom.phases.enablement import RUNGS
from inferloom.phases.runner import start
from inferloom.spec import load_spec
from inferloom.workloads.base import AdapterError, Knob
from inferloom.workloads.synthetic import SyntheticAdapter

SPEC = load_spec(None, {"model": "llama-tiny", "framework": "synthetic", "device": "cpu",
                        "protocol.bootstrap_resamples": 999, "quality.eval_prompts": 2, "quality.heldout_prompts": 2,
                        "quality.prompt_len": 8, "quality.continuation_len": 4})
KNOBS = [Knob("kv_space", "int", 8, "GiB of KV cache", low=1, high=8), Knob("fast_path", "bool", False, "+20%")]


def agents():
    return {"orchestrator": RuleOrchestrator(seed=0), "critic_factory": RuleCritic, "robustness": RuleRobustness()}


class Failing(SyntheticAdapter):
    def __init__(self, kind, works_when=None):
        super().__init__(effects={"fast_path": {True: 1.2}}, numerics={}, knobs=KNOBS, noise_sd=0.02)
        self.kind, self.works_when = kind, works_when or {}

    def prepare(self, config):
        if not self.works_when or any(config.get(k) != v for k, v in self.works_when.items()):
            raise AdapterError(f"server exited ({self.kind})", kind=self.kind)
        return super().prepare(config)

    def recovery_options(self, kind, stock):
        return [{"kv_space": 1}] if kind == "oom" else []


def test_oom_recovered_by_an_environment_change(tmp_path):
    st = start(tmp_path / "s", SPEC, budget_minutes=5, max_trials=1, adapter=Failing("oom", {"kv_space": 1}),
               agents=agents(), kb_url=None)
    assert st.stock_config["kv_space"] == 1 and st.extra.stock_objective.median > 0
    rungs = [e for e in L.read_entries(tmp_path / "s") if e["kind"] == L.ENABLEMENT_RUNG]
    assert rungs[0]["failure_kind"] == "oom" and rungs[1]["outcome"] == "runs"
    assert {r["rung"] for r in rungs} == {1, 2}


def test_model_config_error_stops_naming_the_rung_it_needs(tmp_path):
    st = start(tmp_path / "s", SPEC, budget_minutes=5, max_trials=1, adapter=Failing("model_config"),
               agents=agents(), kb_url=None)
    assert "model_config" in st.stop_reason and f"rung 3 ({RUNGS[2]})" in st.stop_reason
    rungs = [e for e in L.read_entries(tmp_path / "s") if e["kind"] == L.ENABLEMENT_RUNG]
    assert [r["rung"] for r in rungs] == [1, 2, 3, 4, 5, 6]
    assert "no flag or environment change" in rungs[1]["outcome"]


def test_missing_kernel_needs_an_alternate_environment(tmp_path):
    st = start(tmp_path / "s", SPEC, budget_minutes=5, max_trials=1, adapter=Failing("missing_kernel"),
               agents=agents(), kb_url=None)
    assert f"rung 4 ({RUNGS[3]})" in st.stop_reason


def test_vllm_recovery_options_per_failure_kind(tmp_path):
    from inferloom.workloads.base import resolve_config
    from inferloom.workloads.vllm_adapter import VLLMAdapter

    a = VLLMAdapter(load_spec(None, {"framework": "vllm", "device": "cpu",
                                     "serving.env": {"VLLM_CPU_KVCACHE_SPACE": "4"}}), tmp_path)
    stock = resolve_config(a.knob_space(), {})
    assert a.recovery_options("oom", stock)[0] == {"kv_cache_space_gib": 1}
    assert {"enforce_eager": True} in a.recovery_options("startup_timeout", stock)
    assert {"dtype": "float32"} in a.recovery_options("missing_kernel", stock)
    assert a.recovery_options("model_config", stock) == []
