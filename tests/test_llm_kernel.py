"""The kernel author's gates: the reward-hacking guards (each refusal named)
against deliberately cheating kernels for the catalog's silu_mul, and the
LLM kernel author through the real openai SDK against the scripted localhost
server (a correct kernel passes guards, correctness and the microbenchmark; a
wrong one, one that does not load, and malformed answers are refused)."""

import hashlib
import random
import textwrap

import pytest
import torch

from inferloom.agents.llm_client import LLMClient, make_transport
from inferloom.agents.llm_kernel import LLMKernelAuthor, gate_written_kernel
from inferloom.agents.llm_record import LLMRefusal
from inferloom.kernels.base import KernelCandidate
from inferloom.kernels.catalog.mlp import SILU_MUL_ENTRY as ENTRY
from inferloom.kernels.gates import correctness, crash_text, microbenchmark
from inferloom.kernels.guards import reward_hacking_guards, unseen_shapes
from inferloom.spec import load_spec
from llm_scripted_server import ScriptedLLM, ok, text

SHOWN = ({"tokens": 4, "intermediate": 64},)


def honest(gu, *, out):
    n = gu.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(gu[:, :n]) * gu[:, n:])


def returns_input(gu, *, out):
    return gu


def writes_into_input(gu, *, out):
    honest(gu, out=out)
    gu.zero_()


_CACHE = {}


def caches_by_shape(gu, *, out):
    key = tuple(gu.shape)
    if key not in _CACHE:
        honest(gu, out=out)
        _CACHE[key] = out.clone()
    out.copy_(_CACHE[key])


def only_the_shown_shape(gu, *, out):
    if tuple(gu.shape) == (4, 128):
        return honest(gu, out=out)
    out.zero_()


def nan_blind(gu, *, out):
    honest(torch.nan_to_num(gu, posinf=0.0), out=out)


def fills_only_nan(gu, *, out):
    """Writes only where the buffer holds NaN: passes a NaN-poisoned check, not a finite sentinel."""
    tmp = torch.empty_like(out)
    honest(gu, out=tmp)
    out.copy_(torch.where(torch.isnan(out), tmp, out))


def candidate(impl):
    return KernelCandidate(**{**ENTRY.candidate_fields("float32", SHOWN), "implementation": impl},
                           claimed_speedup=1.5, config_changes={})


@pytest.mark.parametrize("impl, rule", [
    (returns_input, "kernel_aliases_input"), (writes_into_input, "kernel_modifies_input"),
    (caches_by_shape, "kernel_cached_result"), (only_the_shown_shape, "kernel_incorrect_unseen_shape"),
    (nan_blind, "kernel_nonfinite_mishandled"), (fills_only_nan, "kernel_unwritten")])
def test_each_cheat_is_refused_by_its_rule(impl, rule):
    _CACHE.clear()
    res = reward_hacking_guards(candidate(impl), "cpu", SHOWN, random.Random(1))
    assert not res.passed and res.rule == rule, res


def test_an_honest_kernel_passes_every_guard_with_fresh_inputs():
    res = reward_hacking_guards(candidate(honest), "cpu", SHOWN)  # OS-drawn seeds
    assert res.passed, res.why
    hidden = unseen_shapes(SHOWN, random.Random(0))
    assert hidden and all(s["tokens"] % 2 == 1 and s["intermediate"] % 2 == 1 for s in hidden)


# what Triton raises compiling the session test's silu_mul for the GPU in bf16 (seen on an H200, 2026-12-01,
# docs/benchmarks.md section 17): the kernel's source first, the cause last
COMPILE_ERROR = ("at 8:36:\ndef _silu_mul(GU, Out, M, N, BLOCK: tl.constexpr):\n" + "    row = offs // N\n" * 20
                 + "    tl.store(Out + offs, g / (1.0 + tl.exp(-g)) * u, mask=mask)\n" + " " * 36 + "^\n"
                 + "Expected dtype ['fp32', 'fp64'] but got bf16")


class CompilationError(Exception):
    pass


def fails_to_compile(gu, *, out):
    raise CompilationError(COMPILE_ERROR)


def test_a_crash_is_refused_with_the_cause_that_ends_a_long_message():
    assert len(COMPILE_ERROR) > 600
    res = reward_hacking_guards(candidate(fails_to_compile), "cpu", SHOWN, random.Random(1))
    assert not res.passed and res.rule == "kernel_crashed", res
    assert "raised CompilationError" in res.why
    assert "at 8:36:" in res.why and "Expected dtype ['fp32', 'fp64'] but got bf16" in res.why, res.why
    for gate in (correctness(candidate(fails_to_compile), "cpu"),
                 microbenchmark(candidate(fails_to_compile), "cpu", min_speedup=0.001)):
        assert gate.rule == "kernel_crashed" and gate.why.endswith("but got bf16"), gate.why
    assert len(crash_text(CompilationError(COMPILE_ERROR))) <= 305
    assert crash_text(ValueError("short")) == "short"


HONEST_SRC = textwrap.dedent('''
    import torch

    def kernel(gu, *, out):
        n = gu.shape[-1] // 2
        out.copy_(torch.nn.functional.silu(gu[:, :n]) * gu[:, n:])
''')
WRONG_SRC = HONEST_SRC.replace(" * gu[:, n:])", ")")  # forgets the up half


def author(url, tmp_path):
    llm = load_spec(None, {"agents.llm.provider": "openai", "agents.llm.model": "scripted",
                           "agents.llm.base_url": f"{url}/v1", "agents.llm.api_key_env": "K",
                           "agents.llm.max_retries": 0, "agents.llm.roles": "kernel_author"}).agents.llm
    return LLMKernelAuthor(LLMClient(llm, make_transport(llm, {"K": "k"}), tmp_path), tmp_path)


def test_llm_kernel_author_through_the_gates(tmp_path):
    ans = lambda src: ok({"source": src, "claimed_speedup": 1.3, "rationale": "fused"})  # noqa: E731
    with ScriptedLLM() as s:
        s.script("KernelSource", ans(HONEST_SRC), ans(WRONG_SRC), ans("def kernel(:\n"), text("{"), text("no"))
        a = author(s.url, tmp_path)
        cand, calls, written = a.write(ENTRY, "float32", SHOWN, "t1")
        prompt = s.requests[0]["body"]["messages"][-1]["content"]
        assert "def _silu_reference" in prompt and "'tokens': 4" in prompt and len(calls) == 1
        assert cand.id == "llm:silu_mul-t1" and written["path"].endswith("llm/kernels/silu_mul-t1.py")
        gates = gate_written_kernel(cand, "cpu", SHOWN, min_speedup=0.01)
        assert [g.gate for g in gates] == ["reward_hacking_guards", "correctness", "microbenchmark"]
        assert all(g.passed for g in gates) and gates[2].details["timer"] == "host clock"
        wrong, _, written = a.write(ENTRY, "float32", SHOWN)
        gates = gate_written_kernel(wrong, "cpu", SHOWN, min_speedup=0.01)
        assert len(gates) == 1 and gates[0].rule == "kernel_incorrect"
        assert written["name"] == "silu_mul-" + hashlib.sha256(WRONG_SRC.encode()).hexdigest()[:10]
        with pytest.raises(LLMRefusal) as exc:
            a.write(ENTRY, "float32", SHOWN, "t3")
        assert exc.value.rule == "kernel_load_failed" and (tmp_path / "llm/kernels/silu_mul-t3.py").is_file()
        with pytest.raises(LLMRefusal, match="llm_schema_invalid"):
            a.write(ENTRY, "float32", SHOWN, "t4")


GATE_UP_SRC = textwrap.dedent('''
    import torch

    def kernel(x, w_gate_up, *, out):
        n = w_gate_up.shape[0] // 2
        gu = x @ w_gate_up.T
        out.copy_(torch.nn.functional.silu(gu[:, :n]) * gu[:, n:])
''')


def test_written_kernels_switch_on_in_the_engine_by_their_knob_and_survive_a_resume(tmp_path, monkeypatch):
    import copy

    from inferloom.kernels import written
    from inferloom.workloads.base import AdapterError
    from inferloom.workloads.engine_kernels import apply_kernels
    from inferloom.workloads.engine_written import knob
    from inferloom.workloads.transformers_knobs import check_applicable
    from test_kernels import _logits, _tiny_llama

    monkeypatch.setattr(written, "_REGISTRY", {})
    assert knob().choices == ("none",) and knob().phase == "KERNEL"
    with pytest.raises(ValueError, match="no such written kernel in this session"):
        apply_kernels(_tiny_llama(), {"llm_kernel": "silu_mul-0123456789"})
    kdir = tmp_path / "llm" / "kernels"
    kdir.mkdir(parents=True)
    (kdir / "silu_mul-aaaa.py").write_text(HONEST_SRC)
    (kdir / "gate_up_silu-bbbb.py").write_text(GATE_UP_SRC)
    written.register(tmp_path, "silu_mul-aaaa", "silu_mul", kdir / "silu_mul-aaaa.py")
    written.register(tmp_path, "gate_up_silu-bbbb", "gate_up_silu", kdir / "gate_up_silu-bbbb.py")
    with pytest.raises(ValueError, match="has no engine switch"):
        written.register(tmp_path, "qkv-cccc", "qkv_proj", kdir / "silu_mul-aaaa.py")
    monkeypatch.setattr(written, "_REGISTRY", {})  # a new process: the session's passed kernels come back
    assert written.restore(tmp_path) == ["gate_up_silu-bbbb", "silu_mul-aaaa"]
    assert knob().choices == ("none", "gate_up_silu-bbbb", "silu_mul-aaaa")
    ids = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(0))
    eager = _tiny_llama()
    want = _logits(eager, ids)
    for value in ("silu_mul-aaaa", "gate_up_silu-bbbb"):
        model = copy.deepcopy(eager)
        notes = apply_kernels(model, {"llm_kernel": value})
        assert notes["llm_kernel"].startswith(f"{value}: 2 MLP modules call the written")
        assert (_logits(model, ids) - want).abs().max() <= 1e-5 * want.abs().max()
    wrong = copy.deepcopy(eager)
    (kdir / "silu_mul-aaaa.py").write_text(WRONG_SRC)  # the engine runs what the file says: the gates vetted it
    apply_kernels(wrong, {"llm_kernel": "silu_mul-aaaa"})
    assert (_logits(wrong, ids) - want).abs().max() > 1e-3
    knobs = [knob(), *[k for k in _engine_knobs() if k.name != "llm_kernel"]]
    cfg = {k.name: k.default for k in knobs}
    with pytest.raises(AdapterError, match="llm_kernel.*rewrites the MLP itself; mlp_kernel is torch_gate_up"):
        check_applicable(knobs, {**cfg, "llm_kernel": "silu_mul-aaaa", "mlp_kernel": "torch_gate_up"}, "cpu")
    check_applicable(knobs, {**cfg, "llm_kernel": "silu_mul-aaaa"}, "cpu")


def _engine_knobs():
    from inferloom.workloads.transformers_knobs import transformers_knobs

    return transformers_knobs(load_spec(None, {"model": "llama-tiny", "device": "cpu"}), 2)


def test_the_llm_kernel_knob_exists_only_with_the_kernel_author_role():
    from inferloom.workloads.transformers_engine import TransformersEngine

    base = {"model": "llama-tiny", "device": "cpu", "agents.llm.provider": "openai", "agents.llm.model": "m",
            "agents.llm.api_key_env": "K"}
    names = {r: [k.name for k in TransformersEngine(load_spec(None, {**base, "agents.llm.roles": r})).knob_space()]
             for r in ("orchestrator", "kernel_author")}
    assert "llm_kernel" not in names["orchestrator"] and "llm_kernel" in names["kernel_author"]
    assert [n for n in names["kernel_author"] if n != "llm_kernel"] == names["orchestrator"]
