"""`inferloom engines` on two real engines: a closed session of a real vLLM CPU server (.venv-vllm) and a closed
session of the in-process transformers engine, both of examples/engines-cpu/'s one workload (llama-tiny, bf16), made
here with small budgets; then the command pairs the two final stacks against each other for real.

Each session is its PRELUDE and CLOSE only (every knob pinned): three vLLM server starts in all (the session's
stock and its A/A twin, the command's one), each ~35 s with --enforce-eager on a quiet 2-core machine."""

import json
import math
import os
from pathlib import Path

from _vllm_env import ROOT, require_vllm

from inferloom import cli
from inferloom.agents.rules import RuleCritic, RuleOrchestrator, RuleRobustness
from inferloom.measure.protocol import ProtocolSettings, decision_at
from inferloom.phases.runner import start
from inferloom.session.state import Phase
from inferloom.spec import load_spec
from inferloom.workloads.registry import make_adapter
from inferloom.workloads.vllm_adapter import VLLMAdapter

EXAMPLE = ROOT / "examples" / "engines-cpu"
SMALL = {"protocol.min_pairs": 3, "protocol.max_pairs": 3, "protocol.warmup_runs": 1}


def _agents():
    return {"orchestrator": RuleOrchestrator(seed=0), "critic_factory": RuleCritic, "robustness": RuleRobustness()}


def _children(pid: int) -> list[str]:
    """Command lines of the live processes whose parent is ``pid``."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append((stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except (OSError, ValueError, IndexError):
            pass
    return out


def test_a_vllm_session_and_a_transformers_session_measured_against_each_other(tmp_path, capsys):
    py = require_vllm()
    vspec = load_spec(EXAMPLE / "vllm.yaml", {"serving.python": py, **SMALL})
    # every vLLM knob pinned at its default: the session is PRELUDE (stock, its A/A) and CLOSE; no trial server
    pins = {k.name: k.default for k in VLLMAdapter(vspec).knob_space()}
    vspec = load_spec(EXAMPLE / "vllm.yaml", {"serving.python": py, **SMALL, "pinned": {**pins, "enforce_eager": True}})
    tspec = load_spec(EXAMPLE / "transformers.yaml", {**SMALL, "kernels.backend": "none"})
    # likewise the transformers engine's knobs, and no KERNEL phase: each session is its PRELUDE and CLOSE (the
    # final stack is stock); what the command measures is the two engines, not a search
    tpins = {k.name: k.default for k in make_adapter(tspec).knob_space()}
    tspec = load_spec(EXAMPLE / "transformers.yaml", {**SMALL, "kernels.backend": "none", "pinned": tpins})
    dirs = {}
    for name, spec, trials in (("vllm", vspec, 1), ("transformers", tspec, 1)):
        # the test's own KB (conftest): the device's ceilings, measured by the first session, serve the second
        st = start(tmp_path / name, spec, budget_minutes=8, max_trials=trials, agents=_agents(), sweep=False)
        assert st.phase == Phase.DONE, (name, st.stop_reason)
        dirs[name] = tmp_path / name
    out = tmp_path / "choice"
    rc = cli.main(["engines", str(dirs["vllm"]), str(dirs["transformers"]), "--out", str(out), "--max-pairs", "3", "--trust-session"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err[-3000:]
    res = json.loads((out / "engines.json").read_text())
    rows = {r["framework"]: r for r in res["sessions"].values()}
    assert set(rows) == {"vllm", "transformers"}
    assert rows["vllm"]["precision"] == "bfloat16 weights, bfloat16 KV cache, bfloat16 activations"
    assert rows["transformers"]["precision"] == "bfloat16 weights and activations"
    assert all(r["stock_median"] > 0 and r["roofline_stock"] is not None for r in rows.values())
    m, d = res["measurement"], res["decision"]
    assert m["verdict"] != "failed", m.get("error")
    assert set(m["labels"]) == {"vllm", "transformers"}
    # each arm ran on its own engine: the server's records carry the load generator's metrics, the engine's don't
    pairs = [json.loads(x) for x in (out / "engines_pairs.jsonl").read_text().splitlines()]
    pairs = [p for p in pairs if p["kind"] == "pair"]
    assert 2 <= len(pairs) == m["n_pairs"] <= 3  # 2: a harm stop (every pair far slower)
    arm = {"a": m["labels"][0], "b": m["labels"][1]}
    for p in pairs:
        for side in ("a", "b"):
            served = "ttfts" in json.dumps(p[side]) or "ttft" in json.dumps(p[side])
            assert served == (arm[side] == "vllm"), (side, arm[side], sorted(p[side]))
        assert math.isclose(p["log_ratio"], math.log(p["value_b"] / p["value_a"]))
        # every run waited for the other engine's server to be quiet: the in-process arm in the pairs' loop, the
        # server arm in its own run; each says how much CPU the other engine's server used meanwhile
        for side in ("a", "b"):
            assert "quiet_wait" in p[side]["extra"] and "idle_servers_cpu_s" in p[side]["extra"], p[side]["extra"]
    # each engine runs here about as fast as in its own session (before each run waited for the other engine's
    # server to be quiet, the in-process engine ran at 112 tok/s here against 1,001 in its session: a vLLM
    # CPU server's threads spin ~1 s after serving, on this 2-core machine)
    for side, values in (("a", m["values_a"]), ("b", m["values_b"])):
        own = rows[arm[side]]["stock_median"]
        assert sorted(values)[len(values) // 2] > own / 3, (arm[side], values, own)
    again = decision_at([p["log_ratio"] for p in pairs], ProtocolSettings(**m["settings"]))
    assert again.verdict == m["verdict"] and math.isclose(again.ratio, m["protocol"]["decision"]["ratio"])
    # the decision follows the measured interval; the recommendation names the faster, or none
    assert d["outcome"] in ("a_faster", "b_faster", "no_difference")
    if d["outcome"] == "no_difference":
        assert res["recommendation"]["deploy"] is None
    else:
        assert res["recommendation"]["deploy"] == d["faster"] and d["ci_low"] > 1.0
    # the two engines' outputs compared (same model and tokenizer: the probes allow); the reference is the
    # transformers engine, whose scores are the exact distribution (the server's are top-k with a uniform tail)
    q = m["quality"]
    assert q["evaluated"] and q["reference"].startswith("transformers"), q
    assert all(0.0 <= s["values"]["top1_agreement"] <= 1.0 for s in q["sets"])
    md = (out / "engines.md").read_text()
    assert res["recommendation"]["headline"] in md and "Quality agreement" in md
    assert "pair 1/3" in cap.err
    assert not [c for c in _children(os.getpid()) if "vllm" in c]  # no server left behind
