"""Server process management with a stand-in server (no vLLM needed): health
wait, failed-launch classification, and teardown of the whole process group."""

import os
import sys
import textwrap

import pytest

from inferloom.workloads.server_process import (
    LaunchError,
    ServerProcess,
    cause_line,
    classify_failure,
    free_port,
    group_alive,
)

# A stand-in server: spawns a grandchild (like vLLM's engine process), then
# serves /health; with --fail-flag it exits like argparse rejecting a flag.
FAKE = textwrap.dedent('''
    import http.server, subprocess, sys, time
    if "--fail-flag" in sys.argv:
        print("api_server.py: error: unrecognized arguments: --no-such-flag 3", file=sys.stderr)
        sys.exit(2)
    if "--oom" in sys.argv:  # the lines a vLLM engine core prints when its KV cache does not fit
        print("(EngineCore pid=2904) INFO 12-05 13:05:46 [gpu_model_runner.py:5347] Model loading took 12.89 GiB")
        print("(EngineCore pid=2904) ERROR 12-05 13:05:59 [core.py:1330] torch.OutOfMemoryError: CUDA out of "
              "memory. Tried to allocate 3.68 GiB. GPU 0 has a total capacity of 139.80 GiB of which 3.28 GiB is free.")
        print("(APIServer pid=2839) RuntimeError: Engine core initialization failed. See root cause above.")
        sys.exit(1)
    if "--hang" in sys.argv:
        time.sleep(600)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    port = int(sys.argv[sys.argv.index("--port") + 1])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
''')


@pytest.fixture
def fake(tmp_path):
    p = tmp_path / "fake_server.py"
    p.write_text(FAKE)
    return p


def _server(fake, tmp_path, *extra):
    port = free_port()
    return ServerProcess([sys.executable, str(fake), "--port", str(port), *extra], dict(os.environ), port,
                         tmp_path / "logs" / "01-x.log")


def test_start_waits_for_health_and_stop_leaves_no_process(fake, tmp_path):
    sp = _server(fake, tmp_path)
    secs = sp.start(timeout_s=30)
    assert secs >= 0 and sp.alive() and group_alive(sp.pgid)
    pgid = sp.pgid
    out = sp.stop()
    assert out["stopped"] and out["left_pids"] == [] and not group_alive(pgid)
    assert "stopped" in sp.log_path.read_text()


def test_rejected_flag_is_classified_and_named(fake, tmp_path):
    sp = _server(fake, tmp_path, "--fail-flag")
    with pytest.raises(LaunchError) as ei:
        sp.start(timeout_s=30)
    assert ei.value.kind == "unsupported_flag" and ei.value.flag == "--no-such-flag"
    assert "unrecognized arguments" in ei.value.log_tail


def test_a_failed_start_names_the_line_that_says_why(fake, tmp_path):
    """The message leads with the root cause, not the last lines (an API server's traceback: on the H200 an
    OLMoE start's stop reason was cut inside vLLM's `sync_wrapper` frames before it said what ran out)."""
    sp = _server(fake, tmp_path, "--oom")
    with pytest.raises(LaunchError) as ei:
        sp.start(timeout_s=30)
    assert ei.value.kind == "oom"
    assert ("(oom: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.68 GiB. GPU 0 has a total "
            "capacity of 139.80 GiB of which 3.28 GiB is free.); log ") in str(ei.value)
    # the published log of that start (docs/results/olmoe-h200-2026-12-05/attempt1): the same line, cut
    from pathlib import Path
    log = (Path(__file__).resolve().parents[1] / "docs" / "results" / "olmoe-h200-2026-12-05" / "attempt1" /
           "stock-2-server-oom.log").read_text()
    why = cause_line(log, classify_failure(log, 1)[0])
    assert why.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.68 GiB.") and len(why) <= 240
    assert cause_line(log, "startup_timeout") is None and cause_line("nothing here", "oom") is None


def test_startup_timeout_kills_the_group(fake, tmp_path):
    sp = _server(fake, tmp_path, "--hang")
    with pytest.raises(LaunchError) as ei:
        sp.start(timeout_s=1.5)
    assert ei.value.kind == "startup_timeout"
    assert not group_alive(sp.pgid)


@pytest.mark.parametrize("log,kind", [
    ("error: argument --kv-cache-dtype: invalid choice: 'int3'", "unsupported_flag"),
    ("ValueError: Available memory on node 0 (8.14/9.46 GiB) ... less than desired CPU memory utilization", "oom"),
    ("torch.OutOfMemoryError: CUDA out of memory", "oom"),
    ("NotImplementedError: fp8 KV cache is not supported on CPU", "missing_kernel"),
    ("OSError: /m does not appear to have a file named config.json", "model_config"),
    ("Segmentation fault", "crash"),
])
def test_classify_failure(log, kind):
    assert classify_failure(log, 1)[0] == kind
    assert classify_failure(log, None, timed_out=True)[0] == "startup_timeout"
