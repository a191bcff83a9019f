"""The KERNEL phase for vLLM servers (no server started): the descriptor names the plugin backend, the
phase picks its targets from the backend's fixed order when the session has no profile, the candidate
passes the correctness gate in process and is measured end to end (synthetic adapter), its knob builds
the plugin overlay a server starts with, and ``verify --remeasure``'s overlay check names a missing or
changed file."""

from __future__ import annotations

import pytest

from inferloom.frameworks import framework
from inferloom.kernels.base import Target
from inferloom.kernels.gates import correctness
from inferloom.phases.kernel import UNPROFILED
from inferloom.phases.runner import start
from inferloom.session import ledger as L
from inferloom.session.state import Phase
from inferloom.workloads import registry as R
from inferloom.workloads import vllm_kernel_overlays as KO
from inferloom.workloads import vllm_plugins as VP
from inferloom.workloads.base import Knob
from inferloom.workloads.synthetic import SyntheticAdapter
from inferloom.workloads.vllm_kernel_backend import FIXED_ORDER, VLLMPluginBackend

WORK = {"device": "cpu", "dtype": "auto", "model": "llama-tiny", "framework": "vllm", "batch": 4, "input_len": 32,
        "output_len": 16, "stack": {"dtype": "auto", KO.PLUGIN_KNOB: "none"}}


def test_the_vllm_descriptor_names_the_plugin_backend_and_the_overlay_check():
    assert isinstance(R.kernel_backend(framework("vllm")), VLLMPluginBackend)
    assert R.kernel_backend(framework("transformers")) is None  # kernels/registry.py's backends
    assert framework("vllm").session_overlays and not framework("transformers").session_overlays
    assert R.session_overlays(framework("transformers"), "/nonexistent", {}, []) == []


def test_the_candidate_runs_the_overlays_own_source_through_the_correctness_gate():
    b = VLLMPluginBackend()
    assert b.unavailable(WORK) is None and b.fixed_order() == FIXED_ORDER == ("normalization", "elementwise")
    (c,) = b.propose([Target("normalization", UNPROFILED, True, "fixed order")], WORK)
    assert c.config_changes == {KO.PLUGIN_KNOB: "torch_rmsnorm"} and c.dtype == "auto"
    res = correctness(c, "cpu")
    assert res.passed, res.why
    wrong = KO.REPLACEMENTS["torch_rmsnorm"].build().source.replace("* self.weight", "* (self.weight + 0.5)")
    from inferloom.workloads import vllm_kernel_backend as KB

    bad = type(c)(**{**c.__dict__, "implementation": KB._rmsnorm_impl(wrong, "wrong")[0]})
    assert correctness(bad, "cpu").rule == "kernel_incorrect"
    assert b.propose([Target("normalization", UNPROFILED, True, "x")],
                     {**WORK, "stack": {KO.PLUGIN_KNOB: "torch_rmsnorm"}}) == []  # already in the stack
    assert b.merge({KO.PLUGIN_KNOB: "torch_silu_mul"}, c.config_changes) == {KO.PLUGIN_KNOB: "torch_rmsnorm+torch_silu_mul"}
    assert b.merge({KO.PLUGIN_KNOB: "none"}, c.config_changes) == c.config_changes


def test_a_combined_value_builds_one_overlay_with_each_replacement(tmp_path):
    knob = KO.plugin_knob()
    assert "torch_rmsnorm+torch_silu_mul" in knob.choices and "torch_rmsnorm+triton_rmsnorm" not in knob.choices
    (ov,) = KO.overlays_for({KO.PLUGIN_KNOB: "torch_rmsnorm+torch_silu_mul"}, tmp_path)
    assert ov.info["ops"] == ["RMSNorm", "SiluAndMul"] and ov.to_dict()["knob"] == {KO.PLUGIN_KNOB: "torch_rmsnorm+torch_silu_mul"}
    assert KO.combine("torch_rmsnorm+torch_silu_mul", "triton_rmsnorm") == "triton_rmsnorm+torch_silu_mul"
    with pytest.raises(VP.EngineOverlayError, match="no such replacement 'nope'"):
        KO.overlays_for({KO.PLUGIN_KNOB: "torch_rmsnorm+nope"}, tmp_path)


def test_a_session_measures_the_plugin_candidate_end_to_end_from_the_fixed_order(tmp_path, monkeypatch):
    from tests.test_session import SPEC, agents

    knobs = [Knob("fast_path", "bool", False, "synthetic +20%"), KO.plugin_knob()]
    ad = SyntheticAdapter(effects={"fast_path": {True: 1.2}, KO.PLUGIN_KNOB: {"torch_rmsnorm": 1.25}}, numerics={},
                          knobs=knobs, noise_sd=0.03)
    spec = SPEC.model_copy(update={"kernels": SPEC.kernels.model_copy(update={"min_speedup": 0.01})})
    lines: list[str] = []
    st = start(tmp_path / "s", spec, budget_minutes=10, max_trials=8, adapter=ad, agents=agents(),
               kernel_backend=VLLMPluginBackend(), progress=lines.append)
    assert st.phase == Phase.DONE
    entries = L.read_entries(tmp_path / "s")
    targets = next(e for e in entries if e["kind"] == "kernel_targets")
    assert "fixed order" in targets["profile_source"] and targets["profile_seq"] is None
    assert [(t["category"], t["share"], t["picked"]) for t in targets["targets"]] == [
        ("normalization", UNPROFILED, True), ("elementwise", UNPROFILED, True)]
    assert any("fixed order instead: normalization, elementwise" in m for m in lines)
    gates = {e["gate"]: e["passed"] for e in entries if e["kind"] == "kernel_gate" and e["candidate"] == "plugin-torch-rmsnorm"}
    # the guards first (a plugin runs where only the quality contract watches it); min_speedup 0.01: any speed passes
    assert gates == {"reward_hacking_guards": True, "correctness": True, "microbenchmark": True}
    (t, t2, *_) = [t for t in st.trials if t.agent == "kernel:vllm_plugin"]
    assert t.changes == {KO.PLUGIN_KNOB: "torch_rmsnorm"} and t.kept and t.verdict != "amdahl_suspect"
    # the next op's replacement is measured with the kept one in the same overlay, not swapped for it
    assert t2.changes == {KO.PLUGIN_KNOB: "torch_rmsnorm+torch_silu_mul"} and not t2.kept
    assert st.stack[KO.PLUGIN_KNOB] == "torch_rmsnorm"  # the ledger's trial config carries the knob's value
    # verify --remeasure asks the descriptor's overlay check before anything runs: with vLLM's check, this
    # session (the synthetic adapter starts no server, so no start recorded the overlay) is exit 2
    from inferloom.evidence import remeasure as RM

    monkeypatch.setattr(RM._engines, "session_overlays", lambda fw, d, changes, entries:
                        KO.check_session_overlays(d, changes, entries))
    with pytest.raises(RM.RemeasureError, match="no server start of the session recorded") as ei:
        RM.final_stack(tmp_path / "s")
    assert ei.value.exit_code == 2


def _session_with_overlay(tmp_path):
    d = tmp_path / "session"
    (ov,) = KO.overlays_for({KO.PLUGIN_KNOB: "torch_rmsnorm"}, d / "servers" / KO.OVERLAY_DIR)
    assert KO.overlays_for({KO.PLUGIN_KNOB: "none"}, d) == []
    entries = [{"kind": L.SERVER_START, "overlays": [ov.to_dict()]}]
    return d, ov, entries


def test_remeasure_rebuilds_the_plugin_overlay_and_checks_the_sessions_copy(tmp_path):
    d, ov, entries = _session_with_overlay(tmp_path)
    changes = {KO.PLUGIN_KNOB: "torch_rmsnorm"}
    (checked,) = KO.check_session_overlays(d, changes, entries)
    assert checked["digest"] == ov.digest and checked["copies"] == [f"servers/{KO.OVERLAY_DIR}/{ov.path.name}"]
    assert KO.check_session_overlays(d, {}, entries) == []
    kernel = next(p for p in ov.files if "/k_" in p)
    with pytest.raises(VP.EngineOverlayError, match="no server start"):
        KO.check_session_overlays(d, changes, [])
    # inferloom's replacement source changed since the session: the rebuilt overlay differs, the kernel named
    changed = {**ov.to_dict(), "digest": "0" * 64, "files": {**ov.files, kernel: "0" * 64}}
    with pytest.raises(VP.EngineOverlayError, match=kernel.replace(".", r"\.")):
        KO.check_session_overlays(d, changes, [{"overlays": [changed]}])
    (ov.path / kernel).write_text((ov.path / kernel).read_text() + "\n# tampered\n")
    with pytest.raises(VP.EngineOverlayError, match=f"{kernel} has sha256") as ei:
        KO.check_session_overlays(d, changes, entries)
    assert ei.value.exit_code == 2
    (ov.path / kernel).unlink()
    with pytest.raises(VP.EngineOverlayError, match=f"{kernel} is missing"):
        KO.check_session_overlays(d, changes, entries)


def test_the_adapter_starts_a_server_with_the_overlay_its_knob_names(tmp_path, monkeypatch):
    from inferloom.spec import load_spec
    from inferloom.workloads import vllm_adapter as VA

    a = VA.VLLMAdapter(load_spec(None, {"framework": "vllm", "device": "cpu", "model": "llama-tiny"}), tmp_path)
    assert a.overlays_of({KO.PLUGIN_KNOB: "none"}) == ()
    (ov,) = a.overlays_of({KO.PLUGIN_KNOB: "torch_rmsnorm"})
    assert ov.path.parent == tmp_path / KO.OVERLAY_DIR and ov.to_dict()["knob"] == {KO.PLUGIN_KNOB: "torch_rmsnorm"}
    assert KO.PLUGIN_KNOB in {k.name for k in a.static_knobs()}
    env = VP.overlay_env(a.overlays_of({KO.PLUGIN_KNOB: "torch_rmsnorm"}), {})
    assert env["PYTHONPATH"] == str(ov.path.absolute())


def test_the_phase_runs_the_descriptors_backend_unless_its_knob_is_pinned_or_absent():
    from types import SimpleNamespace

    from inferloom.phases.kernel import kernel_backend
    from inferloom.spec import load_spec
    from inferloom.workloads.vllm_knobs import vllm_knobs

    def resolved(pinned=None, knobs=None, backend="plugin"):
        spec = load_spec(None, {"framework": "vllm", "device": "cpu", "model": "llama-tiny", "kernels.backend": backend,
                                **({"pinned": pinned} if pinned else {})})
        ctx = SimpleNamespace(options=SimpleNamespace(kernel_backend=None), spec=spec,
                              knobs=vllm_knobs(4) if knobs is None else knobs)
        return kernel_backend(ctx, SimpleNamespace(device="cpu", stack={"dtype": "auto", KO.PLUGIN_KNOB: "none"}))

    b, why = resolved()
    assert isinstance(b, VLLMPluginBackend) and "vllm_plugin" in why
    for kw in ({"pinned": {KO.PLUGIN_KNOB: "none"}}, {"knobs": [Knob("max_num_seqs", "int", 0, "x", low=0, high=8)]}):
        b, why = resolved(**kw)
        assert b is None and "pinned by the spec or not in the adapter's knob space" in why  # no budget kept for it
    assert resolved(backend="none")[0] is None
    b, why = resolved(backend="auto")  # opt-in: auto keeps no share of a server session for plugins
    assert b is None and not isinstance(b, VLLMPluginBackend)
    b, why = resolved(backend="torch")  # the in-process backends rewrite no server
    assert b is None and "torch" in why


def test_the_deploy_command_puts_the_sessions_plugin_overlay_on_pythonpath(tmp_path, monkeypatch):
    from inferloom.spec import load_spec
    from inferloom.workloads.deploy import vllm_deploy

    monkeypatch.setenv("INFERLOOM_CACHE", str(tmp_path / "cache"))
    d, ov, entries = _session_with_overlay(tmp_path)
    spec = load_spec(None, {"framework": "vllm", "model": "llama-tiny", "device": "cpu",
                            "serving.python": "/opt/v/bin/python"})
    dep = vllm_deploy(spec, {KO.PLUGIN_KNOB: "torch_rmsnorm"}, {}, entries)
    assert f"PYTHONPATH={ov.path.absolute()}" in dep["code"] and "VLLM_CACHE_ROOT=" in dep["code"]
    assert any("kernel plugin overlay" in n and ov.digest[:16] in n for n in dep["notes"])
    assert "PYTHONPATH" not in vllm_deploy(spec, {}, {}, entries)["code"]


def test_the_silu_mul_candidate_passes_the_guards_and_correctness_and_a_wrong_one_is_refused():
    from inferloom.phases.kernel import reward_hacking_guards
    from inferloom.workloads import vllm_kernel_backend as KB

    b = VLLMPluginBackend()
    (c,) = b.propose([Target("elementwise", 0.07, True, "profiled")], WORK)
    assert c.id == "plugin-torch-silu-mul" and c.config_changes == {KO.PLUGIN_KNOB: "torch_silu_mul"}
    assert c.shapes[0] == {"tokens": 4, "intermediate": 512}  # llama-tiny's intermediate_size, the decode batch
    assert reward_hacking_guards(c, "cpu").passed and correctness(c, "cpu").passed
    wrong = KO.REPLACEMENTS["torch_silu_mul"].build().source.replace(".mul_(", ".mul_(1.02 * ")
    bad = type(c)(**{**c.__dict__, "implementation": KB._silu_impl(wrong, "wrong")[0]})
    assert correctness(bad, "cpu").rule == "kernel_incorrect"
    # a replacement that hands back its input's memory is caught by the guards, not by correctness
    alias = "def forward(self, x):\n    d = x.shape[-1] // 2\n    return x[..., :d].mul_(0).add_(1)\n"
    hacked = type(c)(**{**c.__dict__, "implementation": KB._silu_impl(alias, "alias")[0]})
    assert reward_hacking_guards(hacked, "cpu").rule in ("kernel_modifies_input", "kernel_incorrect")
    # the Triton catalog's replacements are offered on CUDA only
    cuda = [x.id for x in b.propose([Target("elementwise", 0.07, True, "p"), Target("normalization", 0.03, True, "p")],
                                    {**WORK, "device": "cuda"})]
    assert cuda == ["plugin-torch-silu-mul", "plugin-triton-silu-mul", "plugin-torch-rmsnorm", "plugin-triton-rmsnorm"]


def test_the_gates_run_the_replacement_and_stock_as_the_server_does_compiled_or_eager():
    """A vLLM server compiles its model unless --enforce-eager / -O0: the gates then race compiled stock
    against the compiled replacement (what the server would run), and a replacement torch.compile can't
    trace as one graph is refused by the gate, not at its server's start; an eager stack gets eager gates."""
    from inferloom.kernels.base import workload_of
    from inferloom.kernels.gates import microbenchmark
    from inferloom.spec import load_spec
    from inferloom.workloads import vllm_kernel_backend as KB

    assert KB.server_compiles(WORK)
    for eager in ({"stack": {"enforce_eager": True}}, {"stack": {"optimization_level": "0"}},
                  {"server_args": ["--enforce-eager"]}, {"server_args": ["-O0"]},
                  {"server_args": ["--optimization-level", "0"]}, {"server_args": ["--optimization-level=0"]}):
        assert not KB.server_compiles({**WORK, **eager}), eager
    assert KB.server_compiles({**WORK, "server_args": ["--optimization-level", "3"]})
    spec = load_spec(None, {"framework": "vllm", "model": "llama-tiny", "serving.extra_args": ["--enforce-eager"]})
    assert workload_of(spec, "cpu", {})["server_args"] == ["--enforce-eager"]  # the spec's own arguments reach it

    b = VLLMPluginBackend()
    target = [Target("normalization", UNPROFILED, True, "fixed order")]
    (compiled,) = b.propose(target, WORK)
    (eager,) = b.propose(target, {**WORK, "stack": {**WORK["stack"], "enforce_eager": True}})
    assert compiled.op.endswith("; compiled)") and "both compiled with torch.compile" in compiled.notes
    assert eager.op.endswith("; eager)") and eager.baseline is KB.vllm_rmsnorm  # vLLM's op as written
    assert compiled.baseline is not KB.vllm_rmsnorm and hasattr(compiled.baseline, "_torchdynamo_orig_callable")
    for c in (compiled, eager):
        assert correctness(c, "cpu").passed
        mb = microbenchmark(c, "cpu", runs=6, warmup=2, min_speedup=0.01)
        assert mb.passed and mb.details["speedup"] > 0, mb.why
    # data-dependent Python control flow: fine eagerly, not one graph (vLLM compiles with fullgraph)
    untraceable = KO.REPLACEMENTS["torch_rmsnorm"].build().source.replace(
        "    dtype = x.dtype\n", "    dtype = x.dtype\n    if float(x.abs().max()) > 1e30:\n        return x\n", 1)
    assert untraceable != KO.REPLACEMENTS["torch_rmsnorm"].build().source
    ok = type(eager)(**{**eager.__dict__, "implementation": KB._rmsnorm_impl(untraceable, "untraceable_e")[0]})
    assert correctness(ok, "cpu").passed
    bad = type(compiled)(**{**compiled.__dict__, "implementation": KB._rmsnorm_impl(untraceable, "untraceable_c", True)[0]})
    res = correctness(bad, "cpu")
    assert res.rule == "kernel_crashed" and "torch.compile can't trace it as one graph, as the server would " \
        "(UserError): if float(x.abs().max()) > 1e30" in res.why, res.why
