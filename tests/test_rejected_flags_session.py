"""A flag the server rejected at launch is persisted in the session state, in
the ledger, and refused in every later proposal (no server needed)."""

from inferloom.agents.rules import RuleCritic, RuleRobustness
from inferloom.session import ledger as L
from inferloom.phases.runner import start
from inferloom.spec import load_spec
from inferloom.workloads.base import AdapterError, Knob
from inferloom.workloads.synthetic import SyntheticAdapter

SPEC = load_spec(None, {"model": "llama-tiny", "framework": "synthetic", "device": "cpu",
                        "protocol.bootstrap_resamples": 999, "quality.eval_prompts": 2, "quality.heldout_prompts": 2,
                        "quality.prompt_len": 8, "quality.continuation_len": 4})
KNOBS = [Knob("fast_path", "bool", False, "synthetic +20%"), Knob("newflag", "bool", False, "a flag the server lacks")]


class FlagRejectingAdapter(SyntheticAdapter):
    """Launching with newflag=True fails the way a real server's argparse does."""

    def __init__(self):
        super().__init__(effects={"fast_path": {True: 1.2}}, numerics={}, knobs=KNOBS, noise_sd=0.02)
        self.rejected_flags = {}
        self.launches = 0

    def restore_rejected_flags(self, learned):
        self.rejected_flags.update(learned)

    def prepare(self, config):
        if config.get("newflag"):
            self.launches += 1
            self.rejected_flags["--newflag"] = {"knob": "newflag", "value": True, "kind": "unsupported_flag",
                                                "error": "error: unrecognized arguments: --newflag",
                                                "whole_flag": False}
            raise AdapterError("server exited: unrecognized arguments: --newflag", kind="unsupported_flag")
        return super().prepare(config)


class Scripted:
    name = "scripted"

    def __init__(self, script):
        self.script = list(script)

    def propose(self, state):
        return self.script.pop(0) if self.script else {"action": "end_phase", "rationale": "done"}


def test_rejected_flag_is_persisted_ledgered_and_refused_later(tmp_path):
    a = FlagRejectingAdapter()
    orch = Scripted([{"action": "try_config", "changes": {"newflag": True}},
                     {"action": "try_config", "changes": {"newflag": True, "fast_path": True}}])
    st = start(tmp_path / "s", SPEC, budget_minutes=10, max_trials=5, adapter=a, kb_url=None,
        agents={"orchestrator": orch, "critic_factory": RuleCritic, "robustness": RuleRobustness()})
    assert st.extra.rejected_flags["--newflag"]["knob"] == "newflag"
    assert a.launches == 1  # tried once, never again
    assert [t.verdict for t in st.trials] == ["failed"]
    entries = L.read_entries(tmp_path / "s")
    learned = [e for e in entries if e["kind"] == L.ERROR and e.get("flag") == "--newflag"]
    assert len(learned) == 1
    refusals = [e for e in entries if e["kind"] == L.REFUSAL]
    assert [r["rule"] for r in refusals] == ["rejected_by_server"]
    # after a resume, a fresh adapter gets the learned flags back from state.json
    from types import SimpleNamespace

    from inferloom.phases.coordinator import _sync_rejected_flags
    from inferloom.session.state import load_state

    b = FlagRejectingAdapter()
    _sync_rejected_flags(SimpleNamespace(adapter=b), load_state(tmp_path / "s"), restore=True)
    assert b.rejected_flags["--newflag"]["value"] is True
