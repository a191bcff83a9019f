"""A session that keeps two kernels the LLM kernel author wrote, and
``inferloom verify SESSION --remeasure`` of it: the first kept one
(gate_up_silu, the hottest target) stays in the stack when the second
(add_rmsnorm) passes its gates: the second is measured as the combination of
both (``llm_kernel=<add_rmsnorm-..>+<gate_up_silu-..>``, kernels/written_set.py)
against the stack with the first. The fresh re-measure process registers every
written kernel of the final stack from the session's files exactly as the
session did (after checking each source against the sha256 stored with it)
and measures them against stock again; a member whose source is missing or
changed is refused, naming that member.

The session is real (llama-tiny, transformers, CPU, fp32; the author through
the real openai SDK against the scripted localhost server; the guards, the
gates and the paired end-to-end measurement decide). So that the protocol
keeps the written kernels on this noisy shared CPU, the session's process has
the eager Llama MLP and RMSNorm slowed (a sleep per call, which the written
kernels' rewritten modules do not take): the fresh re-measure process has no
such slow down, so its ratio is the honest one and need not overlap the
session's; the test checks that it ran both written kernels (each kernel
module marks the process that imports it), not that it reproduced the gain."""

import importlib.util
import json
import os
import re
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
from inferloom.session import ledger as L
from inferloom.session.state import Phase
from inferloom.spec import load_spec
from llm_scripted_server import ScriptedLLM, ok
from test_llm_kernel_norm import TORCH_RMSNORM
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
RMSNORM = textwrap.dedent(f'''
    import os

    if os.environ.get("{MARK}"):  # the test's witness, as GATE_UP's
        with open(os.environ["{MARK}"], "a") as f:
            f.write(f"norm:{{os.getpid()}}\\n")
''') + TORCH_RMSNORM  # the plain RMSNorm of test_llm_kernel_norm
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
    eager, eager_norm = modeling_llama.LlamaMLP.forward, modeling_llama.LlamaRMSNorm.forward

    def slow_eager(self, x):  # only in this (the session's) process: the stock MLP the written kernel replaces
        time.sleep(0.04)
        return eager(self, x)

    def slow_norm(self, x):  # and the stock RMSNorm (9 per forward) the written add_rmsnorm kernel replaces
        time.sleep(0.01)
        return eager_norm(self, x)

    mp.setattr(modeling_llama.LlamaMLP, "forward", slow_eager)
    mp.setattr(modeling_llama.LlamaRMSNorm, "forward", slow_norm)
    d = root / "s"
    try:
        with ScriptedLLM() as s:
            # each target gets its own answer whichever is asked first (the cooler ones' shares are close): the
            # MLP's and the RMSNorm's pass, silu_mul (the MLP again) and decode_attention are wrong
            by_op = {"kind": "pick", "by": {"Op: gate_up_silu ": _answer(GATE_UP), "Op: add_rmsnorm ": _answer(RMSNORM),
                                            "Op: silu_mul ": _answer(WRONG_SILU_MUL),
                                            "Op: decode_attention ": _answer(CRASHES)}}
            s.script("KernelSource", by_op, by_op, by_op, by_op)
            spec = load_spec(None, {
                "model": "llama-tiny", "framework": "transformers", "device": "cpu", "traffic.concurrency": 4,
                "traffic.input_len": 32, "traffic.output_len": 8, "traffic.num_prompts": 4,
                "protocol.min_pairs": 6, "protocol.max_pairs": 20, "protocol.bootstrap_resamples": 999,
                "kernels.min_share": 0.0, "kernels.min_speedup": 0.001, "quality.eval_prompts": 4,
                "quality.heldout_prompts": 4, "agents.llm.provider": "openai", "agents.llm.model": "scripted",
                "agents.llm.base_url": f"{s.url}/v1", "agents.llm.api_key_env": "K", "agents.llm.max_retries": 0,
                "agents.llm.roles": "kernel_author"})
            ag = {"orchestrator": EndFramework(), "critic_factory": RuleCritic, "robustness": RuleRobustness(),
                  **llm_agents(spec.agents.llm, d, None, lambda: {}, environ={"K": "k"})}
            st = start(d, spec, budget_minutes=10, max_trials=6, agents=ag, sweep=False,
                       kernel_backend=NoCandidates(), kb_url=None)
    finally:
        mp.undo()
    assert st.phase == Phase.DONE
    value = st.stack.get("llm_kernel")
    trials = [(t.agent, t.changes, t.verdict, t.ratio, t.ci_low, t.ci_high) for t in st.trials]
    # the first kernel that passed is kept; the second is measured as the combination with it, and kept
    ts = [t for t in st.trials if t.agent == "llm-kernel-author"]  # (an Amdahl-suspect one measured twice)
    first = ts[0].changes["llm_kernel"]
    assert any(t.kept for t in ts if t.changes == ts[0].changes), trials
    assert first.split("-")[0] in ("gate_up_silu", "add_rmsnorm"), trials
    second = next(t for t in ts if t.changes["llm_kernel"] != first)
    gate, norm = sorted(second.changes["llm_kernel"].split("+"), key=lambda m: not m.startswith("gate_up_silu-"))
    assert gate.startswith("gate_up_silu-") and norm.startswith("add_rmsnorm-") and first in (gate, norm), trials
    assert second.changes == {"llm_kernel": f"{norm}+{gate}"}, trials  # sorted, joined by +
    m = next(e for e in L.read_entries(d) if e["seq"] == second.measurement_seq)
    assert m["base_config"]["llm_kernel"] == first and m["candidate_config"]["llm_kernel"] == f"{norm}+{gate}"
    assert json.loads((d / "llm/kernels/combined.json").read_text()) == [f"{norm}+{gate}"]
    assert value == f"{norm}+{gate}" and st.stock_config["llm_kernel"] == "none", trials
    return d, value, mark


@pytest.mark.slow
def test_remeasure_registers_the_kept_written_kernel_in_a_fresh_sandboxed_process(kept_session, monkeypatch,
                                                                                  capsys):
    """The fresh process registers both written kernels from the session's files and runs them in the sandbox:
    their module code's write to the witness file (a host path) lands in the sandbox's private /tmp, never here."""
    d, value, mark = kept_session
    monkeypatch.setattr(written, "_REGISTRY", {})
    monkeypatch.setenv(MARK, str(mark))
    before = mark.read_text().split()
    assert str(os.getpid()) in before  # the session's gates and trials imported it here, unsandboxed
    rc = main(["verify", str(d), "--remeasure", "--trust-session", "--max-pairs", "3", "--quiet"])
    out = capsys.readouterr().out
    assert rc in (0, 1), out  # the honest ratio need not overlap the session's (see the module docstring)
    assert "remeasure (fresh process" in out and ", sandboxed" in out and "the session's x" in out
    line = next(x for x in out.splitlines() if x.startswith("remeasure written kernels: "))
    assert all(m in line for m in value.split("+")), line  # it registered (and ran) both written kernels
    assert mark.read_text().split() == before  # the kernels' module code could not write to this host path
    for member in value.split("+"):
        r = json.loads((d / "llm/kernels/passed.json").read_text())[member]
        assert r["sha256"] == written.source_sha256(d / "llm/kernels" / r["path"]) and r["sha256"].startswith(
            member.rsplit("-", 1)[1])


def test_remeasure_of_written_kernels_is_refused_where_the_sandbox_cant_run(kept_session, monkeypatch):
    d, value, mark = kept_session
    monkeypatch.setenv("INFERLOOM_BWRAP", "/nonexistent/bwrap")
    before = mark.read_text()
    with pytest.raises(RemeasureError, match="imports kernels its author wrote.*bubblewrap can't run here.*"
                                             "nothing was run"):
        remeasure(d, max_pairs=3)
    assert mark.read_text() == before


@pytest.mark.slow
@pytest.mark.parametrize("damage, said", [("missing", "is missing"), ("changed", "the file changed since")])
def test_remeasure_refuses_a_written_kernel_whose_source_is_gone_or_changed(kept_session, tmp_path, capsys,
                                                                            damage, said):
    src, value, _ = kept_session
    d = tmp_path / "s"
    shutil.copytree(src, d)
    member = next(m for m in value.split("+") if m.startswith("gate_up_silu-"))  # one member damaged: named
    path = d / "llm/kernels" / f"{member}.py"
    if damage == "missing":
        path.unlink()
    else:
        path.write_text(path.read_text().replace("x @ w_gate_up.T", "x @ w_gate_up.T * 1.0"))
    with pytest.raises(RemeasureError, match=re.escape(f"llm_kernel={value} can't be re-measured: written kernel "
                                                       f"{member}: ") + f".*{said}"):
        remeasure(d, max_pairs=3)
    rc = main(["verify", str(d), "--remeasure", "--trust-session", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and f"written kernel {member}: " in err and said in err
