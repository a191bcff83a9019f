"""Pin the public API of the modules other parts of inferloom build on."""

import importlib

import pytest

API = {
    "inferloom.workloads.base": {"AdapterError", "ConfigError", "Knob", "RunRecord", "WorkloadAdapter",
                                 "resolve_config", "config_key", "ServerLogs", "RejectedFlags", "RecoveryOptions",
                                 "DeclaredProfile", "OwnQualityGate", "OwnObjective", "GreedyLogprobs",
                                 "ApproximateScores", "SourceTrees", "ServerReuse", "OPTIONAL_HOOKS", "CrossKnobRules", "ServerRuns",
                                 "ImageOutputs", "BatchedProbes", "AAQuality", "EnginePatches", "EngineTables", "SourceRungs",
                                 "BudgetedStarts"},
    "inferloom.phases.context": {"Agents", "SessionOptions", "SessionContext", "WorkloadStrategy", "Step", "Progress"},
    "inferloom.phases.trial": {"Guard", "noise_floor_gain", "propose", "begin", "run_trial", "execute_trial",
                               "trial_record", "verdict_entry", "patch_critic"},
    "inferloom.spec": {"SpecError", "Traffic", "QualitySpec", "ProtocolSpec", "ServingSpec", "WorkloadSpec", "load_spec",
                       "objective_label", "spec_hash", "CustomKnob", "CustomSpec", "PatchPolicySpec",
                       "KernelSpec", "field_default", "check_bounds", "REQUESTS_PER_CONCURRENCY", "TaskGateSpec",
                       "NumericsToleranceSpec", "AgentsSpec", "LLMSpec", "DiffusionSpec"},
    "inferloom.workloads.vllm_flags": {"HELP_TIMEOUT_S", "HELP_OPTIONS", "ServerFlags", "parse_help",
                                       "probe_server_flags", "knob_flags", "filter_knobs", "clear_cache"},
    "inferloom.errors": {"InferloomError", "EXIT_BAD_INPUT", "EXIT_RUN_FAILED"},
    "inferloom.sandbox": {"ENV_BINARY", "MODES", "SECRET_PATHS", "Sandbox", "SandboxUnavailable", "bwrap_binary", "required",
                          "probe", "resolve", "start_failure"},
    "inferloom.verify": {"Check", "Findings", "VerifyError", "load_session", "verify_session", "verify_path"},
    "inferloom.bench": {"SCHEMA_VERSION", "run_bench", "run_seed_base", "write_json_atomic", "overall_verdict"},
}


@pytest.mark.parametrize("module", sorted(API))
def test_exported_members(module):
    mod = importlib.import_module(module)
    assert set(mod.__all__) == API[module]
    for name in mod.__all__:
        assert hasattr(mod, name)


def test_protocol_exports_the_decision_api():
    from inferloom.measure import protocol

    for name in ("ProtocolSettings", "decide", "run_paired", "noise_floor"):
        assert name in protocol.__all__
