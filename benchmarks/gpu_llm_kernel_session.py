"""Issue 15 on a GPU: one real session whose KERNEL phase is the LLM kernel author's, through the real openai SDK
against the scripted localhost server of the tests (tests/llm_scripted_server.py), then a summary of what the
gates and the protocol said. benchmarks/gpu_llm_kernel_session.sh runs it on one H200; with TINY=1 (llama-tiny,
CPU, TRITON_INTERPRET=1) it is the CPU rehearsal of the same code path.

The scripted answers are the tests' kernels, read from the test modules' source (ast, not imported: the test
modules need pytest): the Triton RMSNorm (tests/test_llm_kernel_norm.py), the Triton silu_mul
(tests/test_llm_kernel_session.py; its ``tl.exp`` of a bf16 value upcast to fp32 first, since Triton's ``tl.exp``
takes fp32/fp64 only) and the session test's wrong gate_up_silu (it forgets the up projection: the gates must refuse
it); the decode attention is the tests' TRITON_DECODE (tests/test_llm_kernel_attention.py), or ``--decode-source``
(benchmarks/gpu_llm_kernel_session.sh gives benchmarks/llm_kernels/decode_attention_blocked.py: the tests' kernel
loads the whole cache as one tile, which at the unseen shapes' head_dim > 128 takes minutes to compile). ``--verbatim``
(no session) gates the tests' silu_mul and decode attention exactly as the tests have them. The FRAMEWORK phase
ends at once (no trial); the stack is stock with the pinned knobs (--pin; the written decode attention needs
attention_kernel=sdpa and attn_implementation=sdpa, the defaults); the kernel backend proposes nothing of its own,
so the KERNEL phase is the author's alone. Results of the H200 run: docs/benchmarks.md section 17.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


def test_constant(module: str, name: str) -> str:
    """The string ``name = textwrap.dedent('''...''')`` (or a plain string) of tests/<module>.py, dedented."""
    import textwrap

    tree = ast.parse((TESTS / f"{module}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            v = node.value
            if isinstance(v, ast.Call) and v.args:
                v = v.args[0]
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                return textwrap.dedent(v.value)
    raise KeyError(f"{module}.{name}: not a string constant")


SILU_BF16_FIX = ("g = tl.load(GU + row * 2 * N + col, mask=mask, other=0.0)\n",
                 "g = tl.load(GU + row * 2 * N + col, mask=mask, other=0.0).to(tl.float32)\n")


def kernels() -> dict[str, str]:
    silu = test_constant("test_llm_kernel_session", "TRITON_SILU_MUL")
    fixed = silu.replace(*SILU_BF16_FIX)
    if fixed == silu:
        raise SystemExit("the silu_mul test kernel changed: its bf16 upcast no longer applies")
    return {"decode_attention": test_constant("test_llm_kernel_attention", "TRITON_DECODE"),
            "add_rmsnorm": test_constant("test_llm_kernel_norm", "TRITON_RMSNORM"),
            "silu_mul": fixed, "silu_mul_verbatim": silu,
            "gate_up_silu": test_constant("test_llm_kernel_session", "WRONG_GATE_UP")}


class EndFramework:
    name = "end-at-once"

    def propose(self, state):
        return {"action": "end_phase", "rationale": "gpu_llm_kernel_session: straight to KERNEL, the stack pinned"}


class NoCandidates:
    """A kernel backend with nothing of its own: the KERNEL phase is the author's."""

    name = "none-of-its-own"

    def unavailable(self, workload):
        return None

    def rewritable(self):
        return frozenset()

    def propose(self, targets, workload):
        return []


def answer(src: str):
    from llm_scripted_server import ok

    return ok({"source": src, "claimed_speedup": 1.5, "rationale": "scripted: the test suite's kernel"},
              tokens=(2000, 600))


def summarize(d: Path) -> dict:
    from inferloom.session import ledger as L

    entries = L.read_entries(d)
    out: dict = {"asked": [], "gates": [], "refusals": [], "measurements": [], "trials": []}
    for e in entries:
        if e["kind"] == L.AGENT_IO and e.get("role") == "kernel_author":
            o = e["output"]
            out["asked"].append({"entry": e["input"]["entry"], "shown": e["input"]["shown"], "name": o.get("name"),
                                 "refused": o.get("refused"),
                                 "latency_s": [c.get("latency_s") for c in o.get("llm_calls", [])]})
        elif e["kind"] == "kernel_gate":
            out["gates"].append({k: e.get(k) for k in ("candidate", "gate", "passed", "rule", "why", "details")})
        elif e["kind"] == L.REFUSAL:
            out["refusals"].append({k: e.get(k) for k in ("agent", "rule", "why", "output")})
        elif e["kind"] == "kernel_targets":
            out["targets"] = e["targets"]
    state = json.loads((d / "state.json").read_text())
    out["phase"] = state.get("phase")
    out["stack"] = state.get("stack")
    out["trials"] = state.get("trials")
    for name in ("session_breakdown.json",):
        if (d / name).is_file():
            out[name] = json.loads((d / name).read_text())
    return out


def verbatim_check(device: str, dtype: str, shown: list, entry_name: str, src: str, d: Path) -> dict:
    """A test's kernel exactly as the test has it, through the same gates (no session)."""
    from inferloom.agents.llm_kernel import gate_written_kernel, load_kernel, written_candidate
    from inferloom.agents.llm_record import LLMRefusal
    from inferloom.kernels.catalog.index import get

    entry = get(entry_name)
    t0 = time.time()
    try:
        fn = load_kernel(src, d / f"{entry_name}_verbatim.py")
    except LLMRefusal as exc:
        return {"loaded": False, "rule": exc.rule, "why": exc.why}
    cand = written_candidate(entry, dtype, shown, fn, f"{entry_name}-verbatim", 1.5, "the test's kernel verbatim")
    res = gate_written_kernel(cand, device, shown, min_speedup=1.05)
    return {"loaded": True, "seconds": round(time.time() - t0, 1), "gates": [
        {**r.to_dict(), "details": {k: v for k, v in r.to_dict()["details"].items() if not k.endswith("_s")}}
        for r in res]}


def verbatim(a) -> int:
    """--verbatim: the tests' own silu_mul and decode attention, gated at the workload's shapes."""
    from inferloom.kernels.base import workload_of
    from inferloom.kernels.written import shown_shapes
    from inferloom.spec import load_spec
    import yaml

    spec = load_spec(a.spec, {k: yaml.safe_load(v) for k, v in (x.split("=", 1) for x in a.set)})
    work = workload_of(spec, spec.device, {})
    ks = kernels()
    d = Path(a.out)
    d.mkdir(parents=True, exist_ok=True)
    res = {}
    for entry, key in (("silu_mul", "silu_mul_verbatim"), ("decode_attention", "decode_attention")):
        res[key] = verbatim_check(spec.device, str(work["dtype"]), shown_shapes(entry, work), entry, ks[key], d)
        print(key, json.dumps(res[key], default=str)[:1500], flush=True)
        Path(a.summary).write_text(json.dumps(res, indent=1, default=str))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", default=str(ROOT / "examples/llama-3.1-8b-h200.yaml"))
    p.add_argument("--out", required=True, help="the session directory (must not exist)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a spec override (YAML value)")
    p.add_argument("--pin", action="append", default=[], metavar="KNOB=VALUE")
    p.add_argument("--budget-minutes", type=float, default=6.0)
    p.add_argument("--max-trials", type=int, default=4)
    p.add_argument("--summary", required=True, help="JSON summary written here")
    p.add_argument("--verbatim", action="store_true", help="no session: gate the tests' own silu_mul (bf16 "
                   "unsafe) and decode attention verbatim at the workload's shapes")
    p.add_argument("--decode-source", help="the scripted decode_attention answer (default: the tests' TRITON_DECODE)")
    a = p.parse_args()
    sys.path.insert(0, str(TESTS))
    if a.verbatim:
        return verbatim(a)
    import yaml

    from inferloom.agents.llm_setup import llm_agents
    from inferloom.agents.rules import RuleCritic, RuleRobustness
    from inferloom.phases.runner import start
    from inferloom.spec import load_spec
    from llm_scripted_server import ScriptedLLM

    ks = kernels()
    if a.decode_source:
        ks["decode_attention"] = Path(a.decode_source).read_text()
    d = Path(a.out)
    t0 = time.time()
    with ScriptedLLM() as s:
        by_op = {"kind": "pick", "by": {f"Op: {op} ": answer(ks[op])
                                        for op in ("decode_attention", "add_rmsnorm", "silu_mul", "gate_up_silu")}}
        s.script("KernelSource", *([by_op] * 4))
        over = {k: yaml.safe_load(v) for k, v in (x.split("=", 1) for x in a.set)}
        over.update({"agents.llm.provider": "openai", "agents.llm.model": "scripted-tests-kernels",
                     "agents.llm.base_url": f"{s.url}/v1", "agents.llm.api_key_env": "SCRIPTED_KEY",
                     "agents.llm.max_retries": 0, "agents.llm.roles": "kernel_author",
                     "agents.llm.usd_per_mtok_input": 3, "agents.llm.usd_per_mtok_output": 15})
        over.update({f"pinned.{k}": yaml.safe_load(v) for k, v in (x.split("=", 1) for x in a.pin)})
        spec = load_spec(a.spec, over)
        print(f"spec: model {spec.model} device {spec.device} dtype {spec.dtype} traffic {spec.traffic} "
              f"pinned {spec.pinned}", flush=True)
        ag = {"orchestrator": EndFramework(), "critic_factory": RuleCritic, "robustness": RuleRobustness(),
              **llm_agents(spec.agents.llm, d, None, lambda: {}, environ={"SCRIPTED_KEY": "scripted"})}
        err = None
        try:
            start(d, spec, budget_minutes=a.budget_minutes, max_trials=a.max_trials, agents=ag, sweep=False,
                  kernel_backend=NoCandidates(), progress=lambda m: print(f"[{time.time() - t0:7.1f}s] {m}", flush=True))
        except Exception as exc:  # noqa: BLE001 - the summary says what happened
            import traceback

            traceback.print_exc()
            err = f"{type(exc).__name__}: {exc}"
        print(f"session: {time.time() - t0:.1f} s; scripted answers left: {s.left()}", flush=True)
    summary = summarize(d) if (d / "state.json").is_file() else {}
    summary["error"] = err
    summary["wall_s"] = round(time.time() - t0, 1)
    Path(a.summary).write_text(json.dumps(summary, indent=1, default=str))
    for g in summary.get("gates", []):
        det = g.get("details") or {}
        extra = {k: det[k] for k in ("speedup", "kernel_median_s", "baseline_median_s", "timer") if k in det}
        print(f"gate {g['candidate']} {g['gate']}: {'pass' if g['passed'] else 'REFUSED ' + str(g['rule'])} "
              f"{extra} {str(g.get('why'))[:300]}")
    for t in summary.get("trials") or []:
        print("trial", {k: t.get(k) for k in ("trial", "changes", "verdict", "kept", "ratio", "ci_low", "ci_high",
                                              "n_pairs", "quality_passed", "lesson")})
    print("error:", err)
    return 0 if err is None else 1


if __name__ == "__main__":
    sys.exit(main())
