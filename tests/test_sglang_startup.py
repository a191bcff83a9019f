"""Where an SGLang server's start-up went, from its own log (workloads/sglang_startup.py).

The log below is NOT captured from a running server (SGLang does not run on this CPU machine): each line is
built from a format string in SGLang 0.5.17's source, read from the PyPI wheel (``configure_logger``'s
``[%(asctime)s.%(msecs)03d TP0] %(message)s``; ``model_runner``'s ``Load weight begin/end``,
``kv_cache_configurator``'s ``Memory pool end``, ``cuda_graph_setup``'s ``Capture ... CUDA graph begin/end``,
``http_server``'s ``fired up`` line). The numbers in it are made up for the arithmetic, not measurements. A
log captured from a real start on the H200 replaces it when one exists."""

from __future__ import annotations

import pytest

from inferloom.workloads.sglang_startup import PARTS, split_text, startup_split

LOG = """$ /venv/bin/python -m sglang.launch_server --model-path /m --port 30000
[2026-12-03 10:00:05.100] server_args=ServerArgs(model_path='/m', ...)
[2026-12-03 10:00:12.000 TP0] Init torch distributed begin.
[2026-12-03 10:00:12.500 TP0] Init torch distributed ends. elapsed=0.50 s, mem usage=0.00 GB
[2026-12-03 10:00:13.000 TP0] Load weight begin. avail mem=139.20 GB
[2026-12-03 10:00:21.000 TP0] Load weight end. elapsed=7.80 s, type=LlamaForCausalLM, avail mem=124.10 GB, mem usage=15.10 GB.
[2026-12-03 10:00:24.000 TP0] Memory pool end. avail mem=60.00 GB
[2026-12-03 10:00:24.200 TP0] Capture target decode CUDA graph begin. backend=full, bs=[1, 2, 4, 8], avail mem=59.90 GB
[2026-12-03 10:00:34.200 TP0] Capture target decode CUDA graph end. elapsed=10.00 s, mem usage=0.80 GB, avail mem=59.10 GB.
[2026-12-03 10:00:34.300 TP0] max_total_num_tokens=400000, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=4096, context_len=131072, available_gpu_mem=59.10 GB
INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)
[2026-12-03 10:00:36.100] The server is fired up and ready to roll!
"""


def test_a_start_splits_into_sglangs_stated_parts_and_they_sum_to_the_start_up():
    r = startup_split(LOG, 40.0)
    p = r["parts"]
    assert list(p) == [k for k in PARTS if k in p]
    assert p["weights"] == 7.8 and p["cuda_graphs"] == 10.0          # stated by SGLang
    assert p["processes"] == pytest.approx(7.9)                       # first line -> Load weight begin
    assert p["kv_cache"] == pytest.approx(3.0)                        # Load weight end -> Memory pool end
    assert p["warmup"] == pytest.approx(1.9)                          # last graph end -> fired up
    assert p["before_first_log"] == pytest.approx(40.0 - 31.0)        # the lines span 31 s of the 40 s
    assert sum(p.values()) == pytest.approx(40.0) and p["other"] >= 0
    assert r["stated"] == {"load_weight": 7.8, "cuda_graphs": 10.0}
    assert split_text(p).startswith("before first log 9 s, processes 8 s, weights 8 s, kv cache 3 s")


def test_a_log_without_sglang_lines_and_a_start_shorter_than_the_lines():
    assert startup_split("$ python -m sglang.launch_server\nTraceback ...\n", 3.0) == \
        {"parts": {"other": 3.0}, "stated": {}}
    p = startup_split(LOG, 25.0)["parts"]  # estimates shrink first; the parts SGLang states stay
    assert sum(p.values()) == pytest.approx(25.0) and p["weights"] == 7.8 and p["cuda_graphs"] == 10.0


def test_a_real_h200_start_log_splits_as_the_session_recorded_it():
    """The log of a real start of SGLang 0.5.17 on the H200 (2026-12-05, docs/results/sglang-h200-2026-12-05: the
    session's stock server, healthy after 95.45 s; its batch, health and progress-bar lines left out): the parts
    SGLang states are read from its lines and the parts sum to the measured start-up."""
    from pathlib import Path

    log = (Path(__file__).parent / "data" / "sglang" / "server-start-0.5.17-h200.log").read_text()
    r = startup_split(log, 95.45328621300001)
    assert r["stated"] == {"load_weight": 2.04, "cuda_graphs": 36.4}  # prefill graphs 32.03 s + decode 4.37 s
    p = r["parts"]
    assert p["weights"] == 2.04 and p["cuda_graphs"] == 36.4
    assert 20 < p["before_first_log"] < 23 and 25 < p["processes"] < 28 and 8 < p["warmup"] < 9.5
    assert abs(sum(p.values()) - 95.45328621300001) < 0.01
