"""KERNEL phase on CPU: target selection, the correctness and microbenchmark
gates with torch implementations, the Amdahl flag, and the phase in a session
(synthetic adapter with kernel knobs; the real engine with the torch backend)."""

import json
from pathlib import Path

import pytest
import torch

from inferloom.kernels.base import KernelBackend, KernelCandidate
from inferloom.kernels.gates import correctness, microbenchmark
from inferloom.kernels.registry import resolve_backend
from inferloom.kernels.select import select_targets
from inferloom.kernels.torch_backend import (TorchBackend, rmsnorm_eager, rmsnorm_inputs, rmsnorm_reference)
from inferloom.session import ledger as L
from inferloom.phases.runner import start
from inferloom.session.state import Phase
from inferloom.workloads.base import Knob
from inferloom.workloads.synthetic import SyntheticAdapter

H200_PROFILE = Path(__file__).parent.parent / "docs/results/h200-sessions-2026-11-30/first/ledger.jsonl"
SHAPES = ({"batch": 4, "seq": 1, "hidden": 256}, {"batch": 4, "seq": 16, "hidden": 256})


def test_targets_from_the_recorded_h200_profile():
    prof = next(json.loads(x) for x in H200_PROFILE.read_text().splitlines() if json.loads(x)["kind"] == "profile")
    cats = prof["profile"]["categories"]
    t = {x.category: x for x in select_targets(cats, {"attention", "normalization", "gemm"}, min_share=0.02)}
    order = [x.category for x in select_targets(cats, {"gemm"})]
    assert order[0] == "idle" and order[1] == "gemm"  # hottest first
    assert not t["idle"].picked and "not a kernel" in t["idle"].why  # 81% host gaps: never a kernel target
    assert t["gemm"].picked and abs(t["gemm"].share - 0.104) < 1e-3
    assert not t["attention"].picked and "below the 2%" in t["attention"].why  # 1.5% of stock's run
    assert not t["elementwise"].picked and "no kernel for elementwise" in t["elementwise"].why
    assert not t["normalization"].picked


def _cand(impl, baseline=rmsnorm_eager, cid="c", **kw):
    return KernelCandidate(id=cid, target="normalization", op="LlamaRMSNorm (eager)", implementation=impl,
                           baseline=baseline, reference=rmsnorm_reference, make_inputs=rmsnorm_inputs,
                           shapes=kw.pop("shapes", SHAPES), dtype=kw.pop("dtype", "float32"), claimed_speedup=1.3,
                           config_changes={"rmsnorm_impl": "torch_fused"}, **kw)


def _fused(hidden_states, weight, eps, out):
    out.copy_(weight * torch.nn.functional.rms_norm(hidden_states.float(), (hidden_states.shape[-1],), None, eps)
              .to(hidden_states.dtype))


def test_correctness_gate_passes_a_right_kernel_in_fp32_and_bf16():
    for dt in ("float32", "bfloat16"):
        r = correctness(_cand(_fused, dtype=dt), "cpu")
        assert r.passed and r.rule is None, r.why
        assert len(r.details["checks"]) == 2 * 3  # every shape, three fresh seeds
    # the torch backend's own candidate passes too
    [c] = TorchBackend().propose(select_targets({"normalization": {"share": 0.1}}, {"normalization"}),
                                 {"framework": "transformers", "model": "llama-tiny", "batch": 2, "input_len": 8,
                                  "dtype": "float32", "stack": {}})
    assert correctness(c, "cpu").passed


def test_correctness_gate_refuses_wrong_unwritten_nan_and_crashing_kernels():
    def no_weight(hidden_states, weight, eps, out):  # forgets the weight: wrong
        out.copy_(torch.nn.functional.rms_norm(hidden_states, (hidden_states.shape[-1],), None, eps))

    def half_written(hidden_states, weight, eps, out):  # skips the last rows
        n = out.shape[0] // 2 or 1
        _fused(hidden_states[:n], weight, eps, out[:n])

    def nan_kernel(hidden_states, weight, eps, out):
        _fused(hidden_states, weight, eps, out)
        out[0, 0, 0] = float("inf")

    def crash(hidden_states, weight, eps, out):
        raise RuntimeError("no kernel image for this device")

    assert correctness(_cand(no_weight), "cpu").rule == "kernel_incorrect"
    r = correctness(_cand(half_written), "cpu")
    assert r.rule == "kernel_nan_or_unwritten" and "NaN" in r.why
    assert correctness(_cand(nan_kernel), "cpu").rule == "kernel_nan_or_unwritten"
    r = correctness(_cand(crash), "cpu")
    assert r.rule == "kernel_crashed" and "no kernel image" in r.why
    # tolerance is the candidate's own: a tiny error passes a loose tolerance, fails a tight one
    def off(hidden_states, weight, eps, out):
        _fused(hidden_states, weight, eps, out)
        out.mul_(1 + 1e-3)
    assert correctness(_cand(off), "cpu").passed
    assert correctness(_cand(off, tolerance={"rel_l2": 1e-4, "max_rel": 1e-4}), "cpu").rule == "kernel_incorrect"


def _slow(hidden_states, weight, eps, out):  # correct, one row at a time
    for i in range(hidden_states.shape[0]):
        for j in range(hidden_states.shape[1]):
            out[i, j] = rmsnorm_eager(hidden_states[i, j], weight, eps)


@pytest.fixture
def one_thread():
    # intra-op threads spin-wait; on a shared 2-core machine that turns into
    # 10x timing outliers. One thread times what the test means to compare.
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def test_microbenchmark_refuses_a_slower_kernel_and_passes_a_faster_one(one_thread):
    shapes = ({"batch": 16, "seq": 8, "hidden": 512},)
    slow = microbenchmark(_cand(_slow, shapes=shapes), "cpu", runs=15)
    assert not slow.passed and slow.rule == "kernel_not_faster" and slow.details["speedup"] < 1
    assert slow.details["timer"] == "host clock" and slow.details["bytes_rotated"] > slow.details["cache_bytes"]

    def slow_baseline(hidden_states, weight, eps):
        out = torch.empty_like(hidden_states)
        _slow(hidden_states, weight, eps, out)
        return out

    fast = microbenchmark(_cand(_fused, baseline=slow_baseline, shapes=shapes), "cpu", runs=15)
    assert fast.passed and fast.details["speedup"] > 5
    assert len(fast.details["kernel_s"]) == 15  # warm-up excluded


def test_microbenchmark_times_the_kernel_as_delivered_when_the_candidate_says_so(one_thread):
    """``timed``: a kernel delivered as a function returning its result (a server's forward) is raced as that,
    not through the gates' ``out=`` wrapper; here the wrapper is the slow part, so the verdict flips."""
    shapes = ({"batch": 16, "seq": 8, "hidden": 512},)

    def fast(hidden_states, weight, eps):
        return weight * torch.nn.functional.rms_norm(hidden_states.float(), (hidden_states.shape[-1],), None, eps
                                                     ).to(hidden_states.dtype)

    def via_out(hidden_states, weight, eps, out):  # the result, then a slow copy into out
        _slow(hidden_states, weight, eps, out)

    wrapped = microbenchmark(_cand(via_out, shapes=shapes), "cpu", runs=15)
    assert not wrapped.passed and "timed" not in wrapped.details
    delivered = microbenchmark(_cand(via_out, timed=fast, shapes=shapes), "cpu", runs=15)
    assert delivered.details["speedup"] > 5 * wrapped.details["speedup"]
    assert delivered.details["timed"].startswith("the kernel as delivered")


def test_backend_resolution():
    work = {"framework": "transformers", "device": "cpu"}
    b, why = resolve_backend("auto", work)
    assert isinstance(b, TorchBackend) and isinstance(b, KernelBackend)
    assert resolve_backend("none", work) == (None, "spec.kernels.backend is none")
    b, why = resolve_backend("auto", {"framework": "synthetic", "device": "cpu"})
    assert b is None and "synthetic" in why


# ------------------------------------------------------------ the phase in a session
KNOBS = [Knob("fast_path", "bool", False, "synthetic +20%"),
         Knob("k_wrong", "bool", False, "kernel: wrong", phase="KERNEL"),
         Knob("k_slow", "bool", False, "kernel: slower", phase="KERNEL"),
         Knob("k_flat", "bool", False, "kernel: faster op, no end-to-end effect", phase="KERNEL"),
         Knob("k_good", "bool", False, "kernel: faster op, +25% end to end", phase="KERNEL")]


def _fast_baseline(hidden_states, weight, eps):
    out = torch.empty_like(hidden_states)
    _slow(hidden_states, weight, eps, out)
    return out


class ScriptedBackend:
    """Four torch candidates with known truth."""

    name = "scripted"

    def unavailable(self, workload):
        return None

    def rewritable(self):
        return frozenset({"normalization"})

    def propose(self, targets, workload):
        def no_weight(hidden_states, weight, eps, out):
            out.copy_(torch.nn.functional.rms_norm(hidden_states, (hidden_states.shape[-1],), None, eps))

        small = ({"batch": 8, "seq": 4, "hidden": 256},)
        return [_with(_cand(no_weight, cid="wrong", shapes=small), {"k_wrong": True}),
                _with(_cand(_slow, cid="slow", shapes=small), {"k_slow": True}),
                _with(_cand(_fused, baseline=_fast_baseline, cid="flat", shapes=small), {"k_flat": True}),
                _with(_cand(_fused, baseline=_fast_baseline, cid="good", shapes=small), {"k_good": True})]


def _with(c, changes):
    return KernelCandidate(**{**c.__dict__, "config_changes": changes})


def _session(tmp_path, profile_share):
    from tests.test_session import SPEC, agents

    ad = SyntheticAdapter(effects={"fast_path": {True: 1.2}, "k_good": {True: 1.25}}, numerics={}, knobs=KNOBS,
                          noise_sd=0.03, profile={"normalization": profile_share, "gemm": 0.5, "idle": 0.5 - profile_share})
    return start(tmp_path / "s", SPEC, budget_minutes=10, max_trials=8, adapter=ad, agents=agents(),
                 kernel_backend=ScriptedBackend())


def test_kernel_phase_gates_and_end_to_end(tmp_path, one_thread):
    st = _session(tmp_path, 0.4)
    assert st.phase == Phase.DONE
    entries = L.read_entries(tmp_path / "s")
    refusals = {e["output"].get("candidate"): e["rule"] for e in entries if e["kind"] == L.REFUSAL and e["phase"] == "KERNEL"}
    assert refusals == {"wrong": "kernel_incorrect", "slow": "kernel_not_faster"}
    claims = [e for e in entries if e["kind"] == "kernel_claim"]
    assert {c["candidate"]["id"] for c in claims} >= {"wrong", "slow", "flat", "good"}
    assert all(c["candidate"]["claim_status"] == "unverified" for c in claims)
    targets = next(e for e in entries if e["kind"] == "kernel_targets")
    assert [t["category"] for t in targets["targets"] if t["picked"]] == ["normalization"]
    ktrials = {t.changes.popitem()[0]: t for t in st.trials if t.agent == "kernel:scripted"}
    assert set(ktrials) == {"k_flat", "k_good"}  # only gate-passing candidates were measured end to end
    assert not ktrials["k_flat"].kept  # faster op, no end-to-end gain: not kept
    assert ktrials["k_good"].kept and st.stack["k_good"] is True
    assert not st.stack["k_flat"] and not st.stack["k_wrong"] and not st.stack["k_slow"]


def test_a_gain_beyond_amdahl_is_measured_again_before_it_is_kept(tmp_path, one_thread):
    st = _session(tmp_path, 0.05)  # a 5% share allows at most x1.053; the kernel gives x1.25
    entries = L.read_entries(tmp_path / "s")
    good = [t for t in st.trials if t.changes == {"k_good": True}]
    assert [t.verdict for t in good] == ["amdahl_suspect", "keep"]
    assert [e["rule"] for e in entries if e["kind"] == L.REFUSAL and e["rule"] == "amdahl_suspect"]
    assert st.stack["k_good"] is True


def test_framework_leaves_the_kernel_phase_its_share_of_the_budget(tmp_path, one_thread):
    from tests.test_session import SPEC, agents

    many = KNOBS + [Knob(f"flag{i}", "bool", False, "synthetic 0%") for i in range(8)]
    runs = {}
    for share in (0.5, 0.0):
        spec = SPEC.model_copy(update={"kernels": SPEC.kernels.model_copy(update={"budget_share": share})})
        ad = SyntheticAdapter(effects={"fast_path": {True: 1.2}, "k_good": {True: 1.25}}, numerics={}, knobs=many,
                              noise_sd=0.03, profile={"normalization": 0.4, "gemm": 0.3, "idle": 0.3})
        st = start(tmp_path / f"s{share}", spec, budget_minutes=10, max_trials=6, adapter=ad, agents=agents(),
                   kernel_backend=ScriptedBackend())
        entries = L.read_entries(tmp_path / f"s{share}")
        to_kernel = next(e for e in entries if e["kind"] == L.PHASE and e.get("to") == "KERNEL")
        runs[share] = (st, to_kernel)
    st, to_kernel = runs[0.5]
    framework = [t for t in st.trials if not t.agent.startswith("kernel:")]
    first = [t for t in framework if t.cycle == 1]
    assert len(first) == 3 and "spec.kernels.budget_share" in to_kernel["why"]  # 6 - ceil(0.5 * 6)
    assert any(t.changes == {"k_good": True} and t.kept for t in st.trials)  # KERNEL got its trials
    # once the KERNEL phase has had its turn, a later cycle's FRAMEWORK may use the rest
    assert len(st.trials) == 6 and (st.cycle == 1 or len(framework) > 3)
    st, to_kernel = runs[0.0]  # no reserve: FRAMEWORK may use every trial, and KERNEL gets none
    assert "budget_share" not in to_kernel["why"]
    assert not any(t.agent.startswith("kernel:") for t in st.trials)


def test_a_cycle_whose_framework_was_cut_for_the_kernel_share_has_not_converged(tmp_path, one_thread):
    """The H100 8B session (2026-12-06): PRELUDE used FRAMEWORK's part, KERNEL kept nothing, and the session closed
    "converged" with most of its budget left and no configuration tried. Now the configuration search gets the
    rest in one more cycle."""
    from tests.test_session import SPEC, agents

    spec = SPEC.model_copy(update={"kernels": SPEC.kernels.model_copy(update={"budget_share": 0.8})})
    ad = SyntheticAdapter(effects={"fast_path": {True: 1.2}}, numerics={}, knobs=KNOBS, noise_sd=0.03,
                          profile={"normalization": 0.4, "gemm": 0.3, "idle": 0.3})  # no kernel gains anything
    st = start(tmp_path / "s", spec, budget_minutes=10, max_trials=4, adapter=ad, agents=agents(),
               kernel_backend=ScriptedBackend())
    phases = [e for e in L.read_entries(tmp_path / "s") if e["kind"] == L.PHASE and e.get("to")]
    assert [p["to"] for p in phases[:2]] == ["FRAMEWORK", "KERNEL"]  # FRAMEWORK's part (0 of 4 trials) was used
    assert "FRAMEWORK's part" in phases[1]["why"] or "trials used" in phases[1]["why"]
    assert not any(t.kept for t in st.trials if t.agent.startswith("kernel:"))
    again = [p for p in phases if p["to"] == "FRAMEWORK" and "ended early to leave the KERNEL phase" in p["why"]]
    assert len(again) == 1 and st.cycle >= 2
    assert [t for t in st.trials if t.cycle == 2 and not t.agent.startswith("kernel:")]  # the rest was searched
    assert not st.stop_reason.startswith("converged: cycle 1")


def test_amdahl_share_counts_the_categories_the_replaced_op_covers():
    from inferloom.phases.kernel import _share
    from inferloom.session.state_models import KernelTarget

    targets = [KernelTarget(category=c, share=s, picked=True, why="")
               for c, s in (("attention", 0.2), ("memory_copy", 0.25), ("gemm", 0.4))]
    plain = _cand(_fused)
    assert _share(targets, _with(plain, {})) == (None, "")  # normalization is not in this profile
    att = KernelCandidate(**{**plain.__dict__, "target": "attention"})
    assert _share(targets, att) == (0.2, "attention")
    share, spans = _share(targets, KernelCandidate(**{**att.__dict__, "covers": ("memory_copy", "absent")}))
    assert abs(share - 0.45) < 1e-12 and spans == "attention + memory_copy"


def test_kernel_knobs_are_refused_in_framework():
    from inferloom.phases.allowlist import validate_proposal

    state = {"stack": {k.name: False for k in KNOBS}, "device": "cpu", "pinned": {}, "measured_config_keys": []}
    assert validate_proposal({"action": "try_config", "changes": {"k_good": True}}, "FRAMEWORK", state, KNOBS)[1] == "knob_not_in_phase"
    assert validate_proposal({"action": "try_kernel", "changes": {"k_good": True}}, "KERNEL", state, KNOBS)[1] is None
    assert validate_proposal({"action": "try_kernel", "changes": {"fast_path": True}}, "KERNEL", state, KNOBS)[1] == "knob_not_in_phase"


class EndFramework:
    """An orchestrator with nothing to try: FRAMEWORK ends at once, KERNEL runs on stock."""

    name = "end-at-once"

    def propose(self, state):
        return {"action": "end_phase", "rationale": "test: go straight to KERNEL"}


@pytest.mark.slow
def test_real_engine_kernel_phase_with_the_torch_backend(tmp_path):
    from inferloom.agents.rules import RuleCritic, RuleRobustness
    from inferloom.spec import load_spec

    spec = load_spec(None, {"model": "llama-tiny", "framework": "transformers", "device": "cpu",
                            "traffic.concurrency": 4, "traffic.input_len": 32, "traffic.output_len": 16,
                            "traffic.num_prompts": 8, "protocol.min_pairs": 3, "protocol.max_pairs": 5,
                            "protocol.bootstrap_resamples": 999, "kernels.min_share": 0.0,
                            "quality.eval_prompts": 4, "quality.heldout_prompts": 4})
    ag = {"orchestrator": EndFramework(), "critic_factory": RuleCritic, "robustness": RuleRobustness()}
    st = start(tmp_path / "s", spec, budget_minutes=10, max_trials=3, agents=ag, sweep=False)
    assert st.phase == Phase.DONE
    entries = L.read_entries(tmp_path / "s")
    targets = next(e for e in entries if e["kind"] == "kernel_targets")
    assert targets["backend"] == "torch" and targets["profile_source"] == "stock's PRELUDE profile"
    for cat in ("normalization", "gemm"):
        t = next(t for t in targets["targets"] if t["category"] == cat)
        assert t["picked"] and t["share"] > 0
    gates = {(e["candidate"], e["gate"]): e for e in entries if e["kind"] == "kernel_gate"}
    for cid, changes in (("rmsnorm-torch-fused", {"rmsnorm_impl": "torch_fused"}),
                         ("torch-gate-up", {"mlp_kernel": "torch_gate_up"})):
        corr = gates[(cid, "correctness")]
        assert corr["passed"], corr["why"]
        assert len(corr["details"]["checks"]) == 6  # decode and prefill shapes, three seeds
        mb = gates.get((cid, "microbenchmark"))
        assert mb is not None and mb["details"]["speedup"] > 0
        if mb["passed"]:  # then it was measured end to end against stock, with the quality contract
            ts = [t for t in st.trials if t.agent == "kernel:torch" and t.changes == changes]
            assert ts and ts[-1].quality_passed is not None
            m = next(e for e in entries if e["seq"] == ts[-1].measurement_seq)
            assert all(m["candidate_config"][k] == v for k, v in changes.items()) and m["protocol"]["pairs"]
        else:
            assert mb["rule"] == "kernel_not_faster"


def test_attention_hook_runs_in_the_real_engine_and_matches_sdpa(monkeypatch):
    from inferloom.workloads import engine_attention as A
    from inferloom.spec import load_spec
    from inferloom.workloads.transformers_engine import TransformersEngine

    calls = []
    real = A.DECODE_IMPLS["torch_sliced"]

    def counting(q, k, v, start, end, scale):
        calls.append((tuple(q.shape), start.tolist(), end.tolist()))
        return real(q, k, v, start, end, scale)

    monkeypatch.setitem(A.DECODE_IMPLS, "torch_sliced", counting)
    spec = load_spec(None, {"model": "llama-tiny", "device": "cpu", "traffic.concurrency": 4, "traffic.input_len": 16,
                            "traffic.output_len": 8, "traffic.num_prompts": 4})
    eng = TransformersEngine(spec)
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [3, 3]]  # ragged: left padding
    outs = {}
    for name, cfg in (("sdpa", {"cache_implementation": "static"}),
                      ("sliced", {"cache_implementation": "static", "attention_kernel": "torch_sliced"})):
        h = eng.prepare(cfg)
        try:
            outs[name] = eng.greedy(h, prompts, 6)
            if name == "sliced":
                assert "torch_sliced" in h.notes["attention_kernel"]
        finally:
            eng.release(h)
    assert outs["sliced"] == outs["sdpa"]
    assert calls, "the decode attention hook was never called"
    layers, steps = 4, 5  # llama-tiny; the first token comes from prefill (sdpa)
    assert len(calls) == layers * steps
    _, start, end = calls[0]
    assert start == [2, 4, 0, 5] and len(set(end)) == 1  # left padding of 7-token batch; one shared end
    with pytest.raises(Exception, match="CUDA"):
        eng.prepare({"attention_kernel": "triton_decode"})


class Crash(BaseException):
    """Stands in for a kill: nothing in the session catches it."""


def test_a_session_killed_in_the_kernel_phase_resumes_without_duplicates(tmp_path, one_thread):
    from inferloom.phases.runner import resume
    from inferloom.session.state import load_state
    from tests.test_session import SPEC, agents

    def adapter():
        return SyntheticAdapter(effects={"fast_path": {True: 1.2}, "k_good": {True: 1.25}}, numerics={}, knobs=KNOBS,
                                noise_sd=0.03, profile={"normalization": 0.4, "gemm": 0.6})

    class CrashingBackend(ScriptedBackend):
        def __init__(self):
            self.calls = 0

        def propose(self, targets, workload):
            self.calls += 1
            if self.calls == 3:  # mid-phase: after the first candidate's gates, before the next
                raise Crash()
            return super().propose(targets, workload)

    with pytest.raises(Crash):
        start(tmp_path / "s", SPEC, budget_minutes=10, max_trials=8, adapter=adapter(), agents=agents(),
              kernel_backend=CrashingBackend())
    assert load_state(tmp_path / "s").phase == Phase.KERNEL
    st = resume(tmp_path / "s", adapter=adapter(), agents=agents(), kernel_backend=ScriptedBackend())
    assert st.phase == Phase.DONE
    entries = L.read_entries(tmp_path / "s")
    keys = [e["key"] for e in entries if "key" in e]
    assert len(keys) == len(set(keys))
    gates = [(e["candidate"], e["gate"]) for e in entries if e["kind"] == "kernel_gate"]
    assert len(gates) == len(set(gates))  # no gate ran twice for a candidate, across the kill and the cycles
    assert st.stack["k_good"] is True and not st.stack["k_wrong"]


# ------------------------------------------------------------ mlp_kernel: the fused gate/up projection
def _tiny_llama(dtype=torch.float32, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**{"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                         "num_key_value_heads": 2, "vocab_size": 100, "max_position_embeddings": 128, **overrides})
    return LlamaForCausalLM(cfg).to(dtype).eval()


def _logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits.float()


def test_torch_gate_up_gives_eagers_logits_also_compiled():
    import copy

    from inferloom.workloads.engine_kernels import apply_kernels

    ids = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(0))
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
        eager = _tiny_llama(dtype)
        want = _logits(eager, ids)
        fused = copy.deepcopy(eager)
        notes = apply_kernels(fused, {"mlp_kernel": "torch_gate_up"})
        assert notes["mlp_kernel"].startswith("torch_gate_up: 2 MLP modules")
        assert type(fused.model.layers[0].mlp) is type(eager.model.layers[0].mlp)  # class unchanged
        scale = want.abs().max()
        assert (_logits(fused, ids) - want).abs().max() <= tol * scale, dtype
        compiled = torch.compile(fused, fullgraph=True, backend="aot_eager")  # traceable: no graph break
        assert (_logits(compiled, ids) - want).abs().max() <= tol * scale, dtype


def test_torch_gate_up_releases_the_separate_weights():
    import gc
    import weakref

    from inferloom.workloads.engine_kernels import apply_kernels

    model = _tiny_llama()
    n_before = sum(p.numel() for p in model.parameters())
    olds = [weakref.ref(m.mlp.gate_proj.weight) for m in model.model.layers]
    olds += [weakref.ref(m.mlp.up_proj.weight) for m in model.model.layers]
    gate0 = model.model.layers[0].mlp.gate_proj.weight.detach().clone()
    apply_kernels(model, {"mlp_kernel": "torch_gate_up"})
    gc.collect()
    assert all(r() is None for r in olds)  # the separate gate/up weights are gone, not kept beside the fused one
    params = list(model.parameters())
    assert sum(p.numel() for p in params) == n_before  # one copy of every weight
    storages = {p.untyped_storage().data_ptr() for p in params}
    assert len(storages) == len(params)  # and no two parameters share (or duplicate) storage
    mlp = model.model.layers[0].mlp
    assert not hasattr(mlp, "gate_proj") and not hasattr(mlp, "up_proj")
    assert tuple(mlp.gate_up_proj.weight.shape) == (2 * 96, 64) and torch.equal(mlp.gate_up_proj.weight[:96], gate0)
    keys = set(model.state_dict())
    assert "model.layers.0.mlp.gate_up_proj.weight" in keys
    assert not any(k.endswith((".gate_proj.weight", ".up_proj.weight")) for k in keys)
    # the fused weight is an ordinary registered parameter: .to() moves it with the rest
    model.to(torch.float64)
    assert mlp.gate_up_proj.weight.dtype == torch.float64
    assert _logits(model, torch.tensor([[1, 2, 3]])).isfinite().all()


def test_mlp_kernel_refuses_models_it_cannot_rewrite():
    from inferloom.workloads.engine_kernels import apply_kernels

    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp \(LlamaMLP\): gate_proj has a bias"):
        apply_kernels(_tiny_llama(mlp_bias=True), {"mlp_kernel": "torch_gate_up"})
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp .*act_fn is GELU.*not SiLU"):
        apply_kernels(_tiny_llama(hidden_act="gelu"), {"mlp_kernel": "torch_gate_up"})
    with pytest.raises(ValueError, match="Sequential has no Llama-style MLP"):
        apply_kernels(torch.nn.Sequential(torch.nn.Linear(4, 4)), {"mlp_kernel": "torch_gate_up"})
    mixed = _tiny_llama()
    mixed.model.layers[1].mlp.act_fn = torch.nn.ReLU()
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp .*act_fn is ReLU"):
        apply_kernels(mixed, {"mlp_kernel": "torch_gate_up"})
    assert hasattr(mixed.model.layers[0].mlp, "gate_proj")  # every module is checked before any is changed
    with pytest.raises(ValueError, match="unknown implementation"):
        apply_kernels(_tiny_llama(), {"mlp_kernel": "cublaslt"})


def test_engine_mlp_kernel_knob():
    from inferloom.spec import load_spec
    from inferloom.workloads.base import AdapterError
    from inferloom.workloads.transformers_engine import TransformersEngine

    spec = load_spec(None, {"model": "llama-tiny", "device": "cpu", "traffic.concurrency": 2, "traffic.input_len": 8,
                            "traffic.output_len": 4, "traffic.num_prompts": 2})
    eng = TransformersEngine(spec)
    knob = {k.name: k for k in eng.knob_space()}["mlp_kernel"]
    assert knob.phase == "KERNEL" and knob.default == "eager" and knob.changes_numerics
    assert knob.choices == ("eager", "torch_gate_up", "triton_gate_up_silu")
    with pytest.raises(AdapterError, match="triton_gate_up_silu is a CUDA kernel") as exc:
        eng.prepare({"mlp_kernel": "triton_gate_up_silu"})
    assert exc.value.kind == "unsupported"
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8]]
    outs = {}
    for impl in ("eager", "torch_gate_up"):
        h = eng.prepare({"mlp_kernel": impl})
        try:
            outs[impl] = eng.greedy(h, prompts, 4)
            assert ("mlp_kernel" in h.notes) == (impl != "eager")
        finally:
            eng.release(h)
    assert outs["torch_gate_up"] == outs["eager"]


GEMM_WORK = {"framework": "transformers", "device": "cpu", "model": "llama-tiny", "batch": 3, "input_len": 8,
             "output_len": 4, "dtype": "float32", "stack": {}}


def test_torch_backend_proposes_the_fused_gate_up_only_for_a_picked_gemm_and_an_eager_mlp():
    be = TorchBackend()
    assert "gemm" in be.rewritable()
    gemm = select_targets({"gemm": {"share": 0.5}, "normalization": {"share": 0.1}}, be.rewritable())
    ids = [c.id for c in be.propose(gemm, GEMM_WORK)]
    assert ids == ["rmsnorm-torch-fused", "torch-gate-up"]  # stable order
    [c] = [c for c in be.propose(gemm, GEMM_WORK) if c.id == "torch-gate-up"]
    assert c.target == "gemm" and c.config_changes == {"mlp_kernel": "torch_gate_up"}
    assert c.shapes == ({"tokens": 3, "hidden": 256, "intermediate": 512},
                        {"tokens": 24, "hidden": 256, "intermediate": 512})  # decode, prefill (llama-tiny)
    assert [x.id for x in be.propose(select_targets({"gemm": {"share": 0.01}}, be.rewritable()), GEMM_WORK)] == []
    done = {**GEMM_WORK, "stack": {"mlp_kernel": "torch_gate_up"}}
    assert "torch-gate-up" not in [x.id for x in be.propose(gemm, done)]


def test_torch_gate_up_candidate_passes_the_correctness_gate_and_a_wrong_one_does_not():
    import dataclasses

    from inferloom.kernels.base import Target

    for dtype in ("float32", "bfloat16"):
        [c] = TorchBackend().propose([Target("gemm", 0.5, True, "hot")], {**GEMM_WORK, "dtype": dtype})
        ok = correctness(c, "cpu")
        assert ok.passed, ok.why
        base = c.baseline(**c.make_inputs(c.shapes[0], dtype, "cpu", 0)[0])
        assert base.shape == (3, 512)

    def swapped(x, w_gate_up, out):  # SiLU on the up half instead of the gate half
        i = w_gate_up.shape[0] // 2
        gu = torch.nn.functional.linear(x, w_gate_up)
        out.copy_(torch.nn.functional.silu(gu[:, i:]) * gu[:, :i])

    bad = correctness(dataclasses.replace(c, implementation=swapped), "cpu")
    assert not bad.passed and bad.rule == "kernel_incorrect", bad.why
