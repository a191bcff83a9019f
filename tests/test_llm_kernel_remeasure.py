"""``inferloom verify SESSION --remeasure`` of a session that KEPT a kernel the
LLM kernel author wrote: the fresh process registers the written kernel from
the session's files exactly as the session did (after checking its source
against the sha256 stored with it) and measures it against stock again; a
source that is missing or changed is refused, naming the kernel.

The session is real (llama-tiny, transformers, CPU, fp32; the author through
the real openai SDK against the scripted localhost server; the guards, the
gates and the paired end-to-end measurement decide). So that the protocol
keeps the written kernel on this noisy shared CPU, the session's process has
the eager Llama MLP slowed (a sleep per call, which the written kernel's
rewritten MLP does not take): the fresh re-measure process has no such slow
down, so its ratio is the honest one and need not overlap the session's; the
test checks that it ran the written kernel (the kernel module marks the
process that imports it), not that it reproduced the gain."""

import importlib.util
import json
import os
import shutil
import textwrap
import time

import pytest

from inferloom.agents.llm_setup import llm_agents
from inferloom.agents.rules import RuleCritic, RuleRobustness
from inferloom.cli import main
from inferloom.evidence.remeasure import RemeasureError, remeasure
from inferloom.kernels import written
from inferloom.phases.runner import start
from inferloom.session.state import Phase
from inferloom.spec import load_spec
from llm_scripted_server import ScriptedLLM, ok
from test_llm_kernel_session import EndFramework, NoCandidates

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

MARK = "INFERLOOM_TEST_WRITTEN_KERNEL_MARK"
GATE_UP = textwrap.dedent(f'''
    import os

    import torch
    import torch.nn.functional as F

    if os.environ.get("{MARK}"):  # the test's witness: which processes imported this kernel
        with open(os.environ["{MARK}"], "a") as f:
            f.write(f"{{os.getpid()}}\\n")


    def kernel(x, w_gate_up, *, out):
        n = w_gate_up.shape[0] // 2
        gu = x @ w_gate_up.T
        torch.mul(F.silu(gu[:, :n]), gu[:, n:], out=out)
''')
WRONG_SILU_MUL = textwrap.dedent('''
    import torch


    def kernel(gu, *, out):
        out.copy_(torch.nn.functional.silu(gu[:, : gu.shape[1] // 2]))  # forgets the up half
''')

CRASHES = "def kernel(*args, out, **kwargs):\n    raise RuntimeError('scripted: not written')\n"


def _answer(src):
    return ok({"source": src, "claimed_speedup": 1.2, "rationale": "scripted"})


@pytest.fixture(scope="module")
def kept_session(tmp_path_factory):
    from transformers.models.llama import modeling_llama

    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("llm-kernel-remeasure")
    mark = root / "imported-by.txt"
    mp.setenv(MARK, str(mark))
    mp.setattr(written, "_REGISTRY", {})
    eager = modeling_llama.LlamaMLP.forward

    def slow_eager(self, x):  # only in this (the session's) process: the stock MLP the written kernel replaces
        time.sleep(0.02)
        return eager(self, x)

    mp.setattr(modeling_llama.LlamaMLP, "forward", slow_eager)
    d = root / "s"
    try:
        with ScriptedLLM() as s:
            # gemm (gate_up_silu) is the hottest target; the cooler ones (silu_mul, add_rmsnorm, decode_attention)
            # get wrong kernels
            s.script("KernelSource", _answer(GATE_UP), _answer(WRONG_SILU_MUL), _answer(CRASHES), _answer(CRASHES))
            spec = load_spec(None, {
                "model": "llama-tiny", "framework": "transformers", "device": "cpu", "traffic.concurrency": 4,
                "traffic.input_len": 32, "traffic.output_len": 16, "traffic.num_prompts": 8,
                "protocol.min_pairs": 6, "protocol.max_pairs": 10, "protocol.bootstrap_resamples": 999,
                "kernels.min_share": 0.0, "kernels.min_speedup": 0.001, "quality.eval_prompts": 4,
                "quality.heldout_prompts": 4, "agents.llm.provider": "openai", "agents.llm.model": "scripted",
                "agents.llm.base_url": f"{s.url}/v1", "agents.llm.api_key_env": "K", "agents.llm.max_retries": 0,
                "agents.llm.roles": "kernel_author"})
            ag = {"orchestrator": EndFramework(), "critic_factory": RuleCritic, "robustness": RuleRobustness(),
                  **llm_agents(spec.agents.llm, d, None, lambda: {}, environ={"K": "k"})}
            st = start(d, spec, budget_minutes=10, max_trials=4, agents=ag, sweep=False,
                       kernel_backend=NoCandidates(), kb_url=None)
    finally:
        mp.undo()
    assert st.phase == Phase.DONE
    value = st.stack.get("llm_kernel")
    trials = [(t.agent, t.verdict, t.ratio, t.ci_low, t.ci_high) for t in st.trials]
    assert value and value.startswith("gate_up_silu-") and st.stock_config["llm_kernel"] == "none", trials
    assert any(t.kept and t.agent == "llm-kernel-author" for t in st.trials)
    return d, value, mark


@pytest.mark.slow
def test_remeasure_registers_the_kept_written_kernel_in_a_fresh_process(kept_session, monkeypatch, capsys):
    d, value, mark = kept_session
    monkeypatch.setattr(written, "_REGISTRY", {})
    monkeypatch.setenv(MARK, str(mark))
    before = set(mark.read_text().split())
    assert str(os.getpid()) in before  # the session's gates and trials imported it here
    rc = main(["verify", str(d), "--remeasure", "--max-pairs", "3", "--quiet"])
    out = capsys.readouterr().out
    assert rc in (0, 1), out  # the honest ratio need not overlap the session's (see the module docstring)
    assert "remeasure (fresh process" in out and "the session's x" in out
    pid = out.split("remeasure (fresh process ", 1)[1].split(",", 1)[0]
    assert pid != str(os.getpid()) and pid in set(mark.read_text().split()) - before  # it ran the written kernel
    r = json.loads((d / "llm/kernels/passed.json").read_text())[value]
    assert r["sha256"] == written.source_sha256(d / "llm/kernels" / r["path"]) and r["sha256"].startswith(
        value.rsplit("-", 1)[1])


@pytest.mark.slow
@pytest.mark.parametrize("damage, said", [("missing", "is missing"), ("changed", "the file changed since")])
def test_remeasure_refuses_a_written_kernel_whose_source_is_gone_or_changed(kept_session, tmp_path, capsys,
                                                                            damage, said):
    src, value, _ = kept_session
    d = tmp_path / "s"
    shutil.copytree(src, d)
    path = d / "llm/kernels" / f"{value}.py"
    if damage == "missing":
        path.unlink()
    else:
        path.write_text(path.read_text().replace("x @ w_gate_up.T", "x @ w_gate_up.T * 1.0"))
    with pytest.raises(RemeasureError, match=f"llm_kernel={value} can't be re-measured: written kernel {value}: .*{said}"):
        remeasure(d, max_pairs=3)
    rc = main(["verify", str(d), "--remeasure", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and value in err and said in err
