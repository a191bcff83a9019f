"""The LLM kernel author asked for the catalog's ``decode_attention`` signature
(the ``attention`` target) through the real openai SDK against the scripted
localhost server: a correct Triton decode attention kernel (run by the Triton
interpreter, fp32) passes guards, correctness (at the shown shapes and at
unseen ones, whose heads stay a multiple of the KV heads) and the
microbenchmark; wrong ones are refused by their named rule. Once registered,
``llm_kernel`` puts it on the transformers engine's attention path the way
``attention_kernel`` registers the catalog's, decodes llama-tiny like SDPA,
and refuses to stack on ``attention_kernel`` or a non-SDPA
``attn_implementation``."""

import importlib.util
import random
import textwrap

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from triton_helpers import interpreted_imports  # noqa: E402

with interpreted_imports():  # tl.sum / tl.max, which a written decode attention reduces with, for the interpreter
    import triton  # noqa: E402,F401

    from inferloom.kernels.catalog import index  # noqa: E402

from inferloom.agents.llm_kernel import gate_written_kernel  # noqa: E402
from inferloom.kernels import written  # noqa: E402
from inferloom.kernels.guards import unseen_shapes  # noqa: E402
from inferloom.workloads import engine_written  # noqa: E402
from llm_scripted_server import ScriptedLLM, ok  # noqa: E402
from test_llm_kernel import author  # noqa: E402

ATTN = {"batch": 3, "q_heads": 4, "kv_heads": 2, "head_dim": 16, "max_len": 24, "context": 13}
SHOWN = (ATTN, {**ATTN, "ragged": 1, "left_pad": 1})
SEED = 1  # its unseen shapes: 5 query heads over 3 KV heads before the fit (6 after), and 3 over 3 (one group)

TRITON_DECODE = textwrap.dedent('''
    import math

    import triton
    import triton.language as tl


    @triton.jit
    def _decode(Q, K, V, Lens, Starts, Out, s_qb, s_qh, s_qd, s_kb, s_kh, s_ks, s_kd, s_vb, s_vh, s_vs, s_vd,
                s_ob, s_oh, s_od, group, head_dim, scale,
                HAS_STARTS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
        b = tl.program_id(0)
        h = tl.program_id(1)
        kvh = h // group
        end = tl.load(Lens + b).to(tl.int32)
        if HAS_STARTS:
            start = tl.load(Starts + b).to(tl.int32)
        else:
            start = 0
        pos = tl.arange(0, BLOCK_S)
        d = tl.arange(0, BLOCK_D)
        valid = (pos >= start) & (pos < end)
        dm = d < head_dim
        m2 = valid[:, None] & dm[None, :]
        q = tl.load(Q + b * s_qb + h * s_qh + d * s_qd, mask=dm, other=0.0).to(tl.float32)
        k = tl.load(K + b * s_kb + kvh * s_kh + pos[:, None] * s_ks + d[None, :] * s_kd, mask=m2, other=0.0)
        s = tl.where(valid, tl.sum(k.to(tl.float32) * q[None, :], 1) * scale, float("-inf"))
        p = tl.where(valid, tl.exp(s - tl.max(s, 0)), 0.0)
        v = tl.load(V + b * s_vb + kvh * s_vh + pos[:, None] * s_vs + d[None, :] * s_vd, mask=m2, other=0.0)
        o = tl.sum(p[:, None] * v.to(tl.float32), 0) / tl.sum(p, 0)
        tl.store(Out + b * s_ob + h * s_oh + d * s_od, o, mask=dm)


    def kernel(q, k_cache, v_cache, seq_lens, starts=None, scale=None, *, out):
        B, Hq, _, D = q.shape
        Hkv, S = k_cache.shape[1], k_cache.shape[2]
        scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
        _decode[(B, Hq)](q, k_cache, v_cache, seq_lens, starts if starts is not None else seq_lens, out,
                         q.stride(0), q.stride(1), q.stride(3), *k_cache.stride(), *v_cache.stride(),
                         out.stride(0), out.stride(1), out.stride(3), Hq // Hkv, D, scale,
                         HAS_STARTS=starts is not None, BLOCK_S=triton.next_power_of_2(S),
                         BLOCK_D=triton.next_power_of_2(D))
''')
# attends from position 0: reads the left padding (the cache holds NaN there)
IGNORES_STARTS = TRITON_DECODE.replace("HAS_STARTS=starts is not None", "HAS_STARTS=False")
# the group size of the shapes it was shown (4 query heads over 2 KV heads), not the one it is called with
SHOWN_GROUP_ONLY = TRITON_DECODE.replace("Hq // Hkv, D, scale", "2, D, scale")


def _entry():
    return index.get("decode_attention")


def _write(tmp_path, src):
    with ScriptedLLM() as s:
        s.script("KernelSource", ok({"source": src, "claimed_speedup": 1.5, "rationale": "one pass per head"}))
        cand, _, wrote = author(s.url, tmp_path).write(_entry(), "float32", SHOWN)
        prompt = s.requests[0]["body"]["messages"][-1]["content"]
    return cand, wrote, prompt


def test_the_attention_target_is_writable_with_the_catalogs_decode_shapes():
    from inferloom.kernels.catalog_backend import CatalogBackend
    from inferloom.kernels.base import Target

    assert written.WRITABLE["attention"] == "decode_attention" == written.writable("transformers")["attention"]
    work = {"model": "llama-tiny", "batch": 4, "input_len": 32, "output_len": 16, "dtype": "float16",
            "device": "cuda", "framework": "transformers", "stack": {"cache_implementation": "static"}}
    shape = {"batch": 4, "q_heads": 4, "kv_heads": 2, "head_dim": 64, "max_len": 48, "context": 40}
    assert written.shown_shapes("decode_attention", work) == [shape, {**shape, "ragged": 1, "left_pad": 1}]
    (cand,) = CatalogBackend().propose([Target("attention", 0.4, True, "hot")], work)
    assert [dict(s) for s in cand.shapes] == written.shown_shapes("decode_attention", work)  # the same shapes
    assert cand.covers == written.COVERS["decode_attention"]  # and the same Amdahl share (phases/kernel_llm.py)
    # unseen shapes move each dimension on its own: the entry's fit keeps them valid for make_inputs
    fit = _entry().shape_fit
    assert unseen_shapes(SHOWN, random.Random(SEED))[0]["q_heads"] % 3 != 0  # 5 heads over 3: no valid GQA
    for seed in range(50):
        for s in unseen_shapes(SHOWN, random.Random(seed), fit):
            assert s["q_heads"] % s["kv_heads"] == 0 and s["context"] <= s["max_len"] and s not in SHOWN, s


def test_the_decode_attentions_knob_dependencies():
    from inferloom.workloads.base import AdapterError
    from inferloom.workloads.transformers_knobs import check_applicable
    from test_llm_kernel import _engine_knobs

    name = "decode_attention-0123456789"
    assert written.REPLACES["decode_attention"][:2] == ("attention_kernel", "sdpa")
    assert written.stack_refusal("decode_attention", {"attn_implementation": "eager"}) == (
        "the written decode_attention kernel replaces the sdpa path of attn_implementation; the stack's "
        "attn_implementation is eager")
    assert written.stack_refusal("silu_mul", {"attn_implementation": "eager"}) is None
    knobs = [k for k in _engine_knobs() if k.name != "llm_kernel"]
    cfg = {k.name: k.default for k in knobs}
    for other, why in ((("attention_kernel", "torch_sliced"), "rewrites the decode attention itself; attention_kernel "
                        "is torch_sliced"), (("attn_implementation", "eager"), "replaces the sdpa path of attn_")):
        with pytest.raises(AdapterError, match=why):
            check_applicable(knobs, {**cfg, "llm_kernel": name, other[0]: other[1]}, "cpu")
    check_applicable(knobs, {**cfg, "llm_kernel": name, "mlp_kernel": "torch_gate_up", "rmsnorm_impl": "torch_fused"},
                     "cpu")  # other modules


def test_wrong_written_decode_attentions_are_refused_by_their_rule(tmp_path, monkeypatch):
    # the second one is right at the shown shapes: refused at an unseen one, valid only once fitted
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for src, rule in ((IGNORES_STARTS, "kernel_incorrect"), (SHOWN_GROUP_ONLY, "kernel_incorrect_unseen_shape")):
        cand, _, _ = _write(tmp_path, src)
        gates = gate_written_kernel(cand, "cpu", SHOWN, min_speedup=0.001, rng=random.Random(SEED))
        assert len(gates) == 1 and not gates[0].passed and gates[0].rule == rule, gates[0]


def test_a_correct_triton_decode_attention_passes_every_gate_and_decodes_in_the_engine(tmp_path, monkeypatch):
    from inferloom.spec import load_spec
    from inferloom.workloads.transformers_engine import TransformersEngine

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(written, "_REGISTRY", {})
    cand, wrote, prompt = _write(tmp_path, TRITON_DECODE)
    assert "def decode_attention_reference" in prompt and "'left_pad': 1" in prompt
    gates = gate_written_kernel(cand, "cpu", SHOWN, min_speedup=0.001, rng=random.Random(SEED))
    assert [(g.gate, g.passed) for g in gates] == [("reward_hacking_guards", True), ("correctness", True),
                                                   ("microbenchmark", True)], gates
    # the guards' unseen shapes (the seed's first draw) are 6 heads over 3, after the fit, and 3 over 3
    assert {(s["q_heads"], s["kv_heads"]) for s in unseen_shapes(SHOWN, random.Random(SEED), cand.shape_fit)} == {
        (6, 3), (3, 3)}
    name = wrote["name"]
    written.register(tmp_path, name, "decode_attention", wrote["path"])
    calls = []
    real = engine_written._decode

    def counting(fn):
        impl = real(fn)
        return lambda q, k, v, start, end, scale: calls.append((start.tolist(), end.tolist())) or impl(
            q, k, v, start, end, scale)

    monkeypatch.setattr(engine_written, "_decode", counting)
    spec = load_spec(None, {"model": "llama-tiny", "device": "cpu", "traffic.concurrency": 4, "traffic.input_len": 16,
                            "traffic.output_len": 8, "traffic.num_prompts": 4, "agents.llm.provider": "openai",
                            "agents.llm.model": "m", "agents.llm.api_key_env": "K", "agents.llm.roles": "kernel_author"})
    eng = TransformersEngine(spec)
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [3, 3]]  # ragged: left padding
    outs = {}
    for key, cfg in (("sdpa", {"cache_implementation": "static"}),
                     ("written", {"cache_implementation": "static", "llm_kernel": name})):
        h = eng.prepare(cfg)
        try:
            outs[key] = eng.greedy(h, prompts, 6)
            if key == "written":
                assert h.notes["llm_kernel"].startswith(f"{name}: decode steps of 4 attention modules call the "
                                                        f"written decode_attention kernel ({name}.py)")
        finally:
            eng.release(h)
    assert outs["written"] == outs["sdpa"]
    assert len(calls) == 4 * 5  # llama-tiny's 4 layers x 5 decode steps (the first token comes from prefill)
    assert calls[0][0] == [2, 4, 0, 5] and len(set(calls[0][1])) == 1  # each row's left padding; one shared end
