"""The LLM kernel author asked for the catalog's ``add_rmsnorm`` signature
(the ``normalization`` target, a plain RMSNorm: ``no_residual=1``) through the
real openai SDK against the scripted localhost server: a correct Triton
kernel (run by the Triton interpreter, fp32) passes guards, correctness and
the microbenchmark; wrong ones are refused by their named rule. A written
RMSNorm kernel switches on in the transformers engine by ``llm_kernel`` and
refuses to stack on ``rmsnorm_impl``."""

import copy
import importlib.util
import random
import textwrap

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from triton_helpers import interpreted_imports  # noqa: E402

with interpreted_imports():  # tl.sum, which a written RMSNorm reduces with, decorated for the interpreter
    import triton  # noqa: E402,F401

    from inferloom.kernels.catalog import index  # noqa: E402

from inferloom.agents.llm_kernel import gate_written_kernel  # noqa: E402
from inferloom.kernels import written  # noqa: E402
from inferloom.spec import load_spec  # noqa: E402
from inferloom.workloads.engine_written import knob  # noqa: E402
from llm_scripted_server import ScriptedLLM, ok  # noqa: E402
from test_llm_kernel import author  # noqa: E402

SHOWN = ({"tokens": 4, "hidden": 64, "no_residual": 1}, {"tokens": 9, "hidden": 64, "no_residual": 1})

TRITON_RMSNORM = textwrap.dedent('''
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def _rmsnorm(X, W, Out, ROut, n, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n
        x = tl.load(X + row * n + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(ROut + row * n + cols, x, mask=mask)
        var = tl.sum(x * x, 0) / n
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Out + row * n + cols, w * (x * tl.rsqrt(var + eps)), mask=mask)


    def kernel(x, residual, weight, eps=1e-5, *, out):
        o, ro = out
        if residual is not None:
            x = x + residual
        x = x.contiguous()
        n = x.shape[-1]
        _rmsnorm[(x.numel() // n,)](x, weight, o, ro, n, float(eps), BLOCK=triton.next_power_of_2(n))
''')
NO_WEIGHT = TRITON_RMSNORM.replace("tl.store(Out + row * n + cols, w * (", "tl.store(Out + row * n + cols, (")
NO_RESIDUAL_OUT = TRITON_RMSNORM.replace("tl.store(ROut + row * n + cols, x, mask=mask)", "")
RETURNS_INPUT = TRITON_RMSNORM + "    return x\n"  # x.contiguous() of a contiguous x is x itself


def _entry():
    return index.get("add_rmsnorm")


def test_the_normalization_target_is_writable_as_a_plain_rmsnorm():
    assert written.WRITABLE["normalization"] == "add_rmsnorm"
    shown = written.shown_shapes("add_rmsnorm", {"model": "llama-tiny", "batch": 4, "input_len": 32})
    assert shown == [{"tokens": 4, "hidden": 256, "no_residual": 1}, {"tokens": 128, "hidden": 256, "no_residual": 1}]


@pytest.mark.parametrize("src, rule", [(NO_WEIGHT, "kernel_incorrect"), (NO_RESIDUAL_OUT, "kernel_unwritten"),
                                       (RETURNS_INPUT, "kernel_aliases_input")])
def test_wrong_written_rmsnorms_are_refused_by_their_rule(tmp_path, monkeypatch, src, rule):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with ScriptedLLM() as s:
        s.script("KernelSource", ok({"source": src, "claimed_speedup": 1.3, "rationale": "one pass"}))
        cand, _, _ = author(s.url, tmp_path).write(_entry(), "float32", SHOWN)
    gates = gate_written_kernel(cand, "cpu", SHOWN, min_speedup=0.001, rng=random.Random(3))
    assert len(gates) == 1 and not gates[0].passed and gates[0].rule == rule, gates[0]


def test_a_correct_triton_rmsnorm_passes_every_gate_and_switches_on_in_the_engine(tmp_path, monkeypatch):
    from inferloom.workloads.base import AdapterError
    from inferloom.workloads.engine_kernels import apply_kernels
    from inferloom.workloads.transformers_knobs import check_applicable
    from test_kernels import _logits, _tiny_llama
    from test_llm_kernel import _engine_knobs

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(written, "_REGISTRY", {})
    with ScriptedLLM() as s:
        s.script("KernelSource", ok({"source": TRITON_RMSNORM, "claimed_speedup": 1.3, "rationale": "one pass"}))
        cand, _, wrote = author(s.url, tmp_path).write(_entry(), "float32", SHOWN)
        prompt = s.requests[0]["body"]["messages"][-1]["content"]
    assert "def rmsnorm_reference" in prompt and "'no_residual': 1" in prompt
    gates = gate_written_kernel(cand, "cpu", SHOWN, min_speedup=0.001)
    assert [(g.gate, g.passed) for g in gates] == [("reward_hacking_guards", True), ("correctness", True),
                                                   ("microbenchmark", True)], gates
    name = wrote["name"]
    written.register(tmp_path, name, "add_rmsnorm", wrote["path"])
    ids = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(0))
    eager = _tiny_llama()
    want = _logits(eager, ids)
    model = copy.deepcopy(eager)
    notes = apply_kernels(model, {"llm_kernel": name})
    assert "RMSNorm modules call the written add_rmsnorm kernel" in notes["llm_kernel"]
    assert (_logits(model, ids) - want).abs().max() <= 1e-4 * want.abs().max()
    knobs = [knob(), *[k for k in _engine_knobs() if k.name != "llm_kernel"]]
    cfg = {k.name: k.default for k in knobs}
    with pytest.raises(AdapterError, match="rewrites the RMSNorms itself; rmsnorm_impl is torch_fused"):
        check_applicable(knobs, {**cfg, "llm_kernel": name, "rmsnorm_impl": "torch_fused"}, "cpu")
    check_applicable(knobs, {**cfg, "llm_kernel": name, "mlp_kernel": "torch_gate_up"}, "cpu")  # other modules



TORCH_RMSNORM = textwrap.dedent('''
    import torch


    def kernel(x, residual, weight, eps=1e-5, *, out):
        o, ro = out
        r = x if residual is None else x + residual
        ro.copy_(r)
        rf = r.float()
        o.copy_(weight * (rf * torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + eps)).to(r.dtype))
''')


def test_the_diffusers_engine_switches_a_written_rmsnorm_on_in_the_denoisers_qk_norms(tmp_path, monkeypatch):
    from inferloom.kernels.base import workload_of
    from inferloom.measure import quality as Q
    from inferloom.workloads.diffusers_engine import DiffusersEngine
    from test_diffusers_kernels import TINY, _stock_stack

    monkeypatch.setattr(written, "_REGISTRY", {})
    kdir = tmp_path / "llm" / "kernels"
    kdir.mkdir(parents=True)
    for name, src in (("add_rmsnorm-aaaa", TORCH_RMSNORM), ("silu_mul-bbbb", "def kernel(gu, *, out):\n    pass\n")):
        (kdir / f"{name}.py").write_text(src)
        written.register(tmp_path, name, name.split("-")[0], kdir / f"{name}.py")
    assert written.writable("diffusers") == {"normalization": "add_rmsnorm"}
    assert written.writable("vllm") == {"elementwise": "silu_mul", "normalization": "add_rmsnorm"}  # its plugin
    assert written.writable("sglang") == {}  # no llm_kernel switch
    spec = load_spec(None, {**TINY, "model": "sd35-tiny", "agents.llm.provider": "openai", "agents.llm.model": "m",
                            "agents.llm.api_key_env": "K", "agents.llm.roles": "kernel_author"})
    work = workload_of(spec, "cpu", _stock_stack(spec))
    assert written.shown_shapes("add_rmsnorm", work) == [{"tokens": 2792, "hidden": 8, "no_residual": 1},
                                                          {"tokens": 64, "hidden": 8, "no_residual": 1}]
    e = DiffusersEngine(spec)
    try:
        assert e.knob_space()[-1].name == "llm_kernel" and e.knob_space()[-1].phase == "KERNEL"
        assert "rewrites the RMSNorms itself; rmsnorm_impl is torch_fused" in e.config_refusal(
            {"llm_kernel": "add_rmsnorm-aaaa", "rmsnorm_impl": "torch_fused"})
        assert "only a written add_rmsnorm kernel" in e.config_refusal({"llm_kernel": "silu_mul-bbbb"})
        th = Q.QualityThresholds.from_spec(e.spec.quality)
        items = Q.quality_prompt_sets(e.spec, e)["eval"]
        stock = e.prepare({})
        ref = Q.capture_reference(e, stock, "eval", items, 0)
        e.release(stock)
        h = e.prepare({"llm_kernel": "add_rmsnorm-aaaa"})
        try:
            assert h.notes["llm_kernel"] == ("add_rmsnorm-aaaa: 8 RMSNorm modules call the written add_rmsnorm "
                                             "kernel (add_rmsnorm-aaaa.py)")
            v = Q.evaluate(e, h, ref, th)
            assert v.passed, v.message  # the same numerics up to rounding
        finally:
            e.release(h)
    finally:
        e.close()
    plain = load_spec(None, {**TINY, "model": "sd35-tiny"})
    pe = DiffusersEngine(plain)
    try:
        assert "llm_kernel" not in [k.name for k in pe.knob_space()]
    finally:
        pe.close()


@pytest.mark.parametrize("framework, want", [
    ("transformers", ["gate_up_silu", "decode_attention", "add_rmsnorm", "silu_mul"]), ("diffusers", ["add_rmsnorm"]),
    ("vllm", ["add_rmsnorm", "silu_mul"]), ("sglang", ["gate_up_silu", "decode_attention", "add_rmsnorm", "silu_mul"])])
def test_the_author_is_asked_for_what_the_engine_can_switch_on_hottest_first(framework, want):
    from types import SimpleNamespace as NS

    from inferloom.phases.kernel_llm import author_entries

    targets = [NS(category=c, picked=p) for c, p in (("gemm", True), ("attention", True), ("normalization", True),
                                                      ("elementwise", True), ("other", False))]
    ctx = NS(agents=NS(kernel_author=object()), spec=NS(framework=framework))
    # vllm: what its plugin takes (written_ops); sglang has no llm_kernel switch: listed as before, then refused
    # kernel_no_engine_switch before any LLM call
    assert author_entries(ctx, NS(targets=targets)) == want
    assert author_entries(NS(agents=NS(kernel_author=None), spec=ctx.spec), NS(targets=targets)) == []
