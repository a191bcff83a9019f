"""The LLM kernel author in a real session on llama-tiny (transformers, CPU,
fp32), through the real openai SDK against the scripted localhost server: in
the KERNEL phase it is asked for the hottest picked target it can write for
(gemm -> the catalog's gate_up_silu signature; a wrong kernel: refused by the
guards by name, never measured), then the next (elementwise -> silu_mul; a
correct Triton kernel, run by the Triton interpreter): guards, correctness and
microbenchmark pass, and the kernel is switched on in the engine by the
``llm_kernel`` knob and measured end to end against stock with the quality
contract, like a catalog kernel; the protocol decides. Then the others
(normalization -> add_rmsnorm as a plain RMSNorm, attention ->
decode_attention; wrong kernels: refused), in the order of their shares."""

import importlib.util
import json
import textwrap

import pytest

from inferloom.agents.llm_setup import llm_agents
from inferloom.agents.rules import RuleCritic, RuleRobustness
from inferloom.kernels import written
from inferloom.phases.runner import start
from inferloom.session import ledger as L
from inferloom.session.state import Phase
from inferloom.spec import load_spec
from llm_scripted_server import ScriptedLLM, ok

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

TRITON_SILU_MUL = textwrap.dedent('''
    import triton
    import triton.language as tl


    @triton.jit
    def _silu_mul(GU, Out, M, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < M * N
        row = offs // N
        col = offs % N
        g = tl.load(GU + row * 2 * N + col, mask=mask, other=0.0)
        u = tl.load(GU + row * 2 * N + N + col, mask=mask, other=0.0)
        tl.store(Out + offs, g / (1.0 + tl.exp(-g)) * u, mask=mask)


    def kernel(gu, *, out):
        gu = gu.contiguous()
        m, n = gu.shape[0], gu.shape[1] // 2
        _silu_mul[(triton.cdiv(m * n, 4096),)](gu, out, m, n, BLOCK=4096)
''')
WRONG_GATE_UP = textwrap.dedent('''
    import torch


    def kernel(x, w_gate_up, *, out):
        n = w_gate_up.shape[0] // 2
        out.copy_(torch.nn.functional.silu(x @ w_gate_up[:n].T))  # forgets the up projection
''')

WRONG_RMSNORM = textwrap.dedent('''
    import torch


    def kernel(x, residual, weight, eps=1e-5, *, out):
        o, ro = out
        ro.copy_(x)
        o.copy_(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))  # forgets the weight
''')


WRONG_ATTENTION = textwrap.dedent('''
    import torch


    def kernel(q, k_cache, v_cache, seq_lens, starts=None, scale=None, *, out):
        out.copy_(q)  # not attention at all
''')


class EndFramework:
    name = "end-at-once"

    def propose(self, state):
        return {"action": "end_phase", "rationale": "test: go straight to KERNEL"}


class NoCandidates:
    """A kernel backend with nothing of its own: the KERNEL phase is the author's."""

    name = "none-of-its-own"

    def unavailable(self, workload):
        return None

    def rewritable(self):
        return frozenset()

    def propose(self, targets, workload):
        return []


def answer(src):
    return ok({"source": src, "claimed_speedup": 1.2, "rationale": "scripted"}, tokens=(900, 300))


@pytest.mark.slow
def test_llm_kernel_author_in_a_real_session(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(written, "_REGISTRY", {})
    d = tmp_path / "s"
    with ScriptedLLM() as s:
        # silu_mul, add_rmsnorm and decode_attention come in the order of their profile shares, which are close
        # on a CPU and swap with the machine's load: each gets its own answer whichever is asked first
        by_op = {"kind": "pick", "by": {"Op: silu_mul ": answer(TRITON_SILU_MUL), "Op: add_rmsnorm ": answer(WRONG_RMSNORM),
                                        "Op: decode_attention ": answer(WRONG_ATTENTION)}}
        s.script("KernelSource", answer(WRONG_GATE_UP), by_op, by_op, by_op)
        spec = load_spec(None, {
            "model": "llama-tiny", "framework": "transformers", "device": "cpu", "traffic.concurrency": 4,
            "traffic.input_len": 32, "traffic.output_len": 16, "traffic.num_prompts": 8, "protocol.min_pairs": 3,
            "protocol.max_pairs": 5, "protocol.bootstrap_resamples": 999, "kernels.min_share": 0.0,
            # the interpreter is slower than torch on the op: let it through to the end-to-end measurement
            "kernels.min_speedup": 0.001, "quality.eval_prompts": 4, "quality.heldout_prompts": 4,
            "agents.llm.provider": "openai", "agents.llm.model": "scripted", "agents.llm.base_url": f"{s.url}/v1",
            "agents.llm.api_key_env": "K", "agents.llm.max_retries": 0, "agents.llm.roles": "kernel_author",
            "agents.llm.usd_per_mtok_input": 3, "agents.llm.usd_per_mtok_output": 15})
        ag = {"orchestrator": EndFramework(), "critic_factory": RuleCritic, "robustness": RuleRobustness(),
              **llm_agents(spec.agents.llm, d, None, lambda: {}, environ={"K": "k"})}
        st = start(d, spec, budget_minutes=10, max_trials=3, agents=ag, sweep=False, kernel_backend=NoCandidates())
        assert not s.left()
    assert st.phase == Phase.DONE
    entries = L.read_entries(d)
    asked = [e for e in entries if e["kind"] == L.AGENT_IO and e.get("role") == "kernel_author"]
    # gemm is the hottest target; the other two in the order of their (close) shares
    assert [a["input"]["entry"] for a in asked][0] == "gate_up_silu"
    assert sorted(a["input"]["entry"] for a in asked[1:]) == ["add_rmsnorm", "decode_attention", "silu_mul"]
    name = {a["input"]["entry"]: a["output"]["name"] for a in asked}
    wrong, right, wrong_norm = name["gate_up_silu"], name["silu_mul"], name["add_rmsnorm"]
    wrong_attn = name["decode_attention"]
    assert all(a["output"]["llm_calls"][0]["role"] == "kernel_author" for a in asked)
    refused = [e for e in entries if e["kind"] == L.REFUSAL and e["agent"] == "llm-kernel-author"]
    assert sorted((r["rule"], r["output"]["candidate"]) for r in refused) == sorted([
        ("kernel_incorrect", f"llm:{wrong}"), ("kernel_incorrect", f"llm:{wrong_norm}"),
        ("kernel_incorrect", f"llm:{wrong_attn}")])
    # each claim's Amdahl share covers what the catalog's candidate for the same op covers: the written decode
    # attention replaces repeat_kv's cache copy too (memory_copy, elementwise), the others only their own target
    claims = {e["candidate"]["id"]: e["candidate"] for e in entries if e["kind"] == "kernel_claim"}
    assert claims[f"llm:{wrong_attn}"]["covers"] == ["memory_copy", "elementwise"]
    assert claims[f"llm:{right}"]["covers"] == [] and claims[f"llm:{wrong}"]["covers"] == []
    gates = {(e["candidate"], e["gate"]): e for e in entries if e["kind"] == "kernel_gate"}
    assert set(gates) == {(f"llm:{w}", "reward_hacking_guards") for w in (wrong, wrong_norm, wrong_attn)} | {
        (f"llm:{right}", g) for g in ("reward_hacking_guards", "correctness", "microbenchmark")}
    assert all(gates[(f"llm:{right}", g)]["passed"] for g in ("reward_hacking_guards", "correctness", "microbenchmark"))
    # only the kernel that passed was measured end to end, with the quality contract, switched on by its knob
    ts = [t for t in st.trials if t.agent == "llm-kernel-author"]
    assert [t.changes for t in ts] == [{"llm_kernel": right}] and ts[0].quality_passed is not None
    m = next(e for e in entries if e["seq"] == ts[0].measurement_seq)
    assert m["candidate_config"]["llm_kernel"] == right and m["protocol"]["pairs"]
    sha = written.source_sha256(d / f"llm/kernels/{right}.py")
    assert sha.startswith(right.rsplit("-", 1)[1])  # the name carries the source's hash, and passed.json all of it
    assert json.loads((d / "llm/kernels/passed.json").read_text()) == {right: {"entry": "silu_mul",
                                                                             "path": f"{right}.py", "sha256": sha}}
    b = json.loads((d / "session_breakdown.json").read_text())
    assert b["llm"]["by_role"]["kernel_author"]["calls"] == 4
