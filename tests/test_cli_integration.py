"""`inferloom bench` for real, through the CLI, on llama-tiny on CPU."""

import json
import os
import subprocess
import sys

import pytest

SMALL = ["--model", "llama-tiny", "--device", "cpu", "--concurrency", "4", "--input-len", "32",
         "--output-len", "16", "--num-prompts", "8", "--min-pairs", "3", "--max-pairs", "5"]


def cli(*args, cwd=None):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "inferloom.cli", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=600)


@pytest.mark.slow
def test_bench_candidate_end_to_end(tmp_path):
    out = tmp_path / "r.json"
    p = cli("bench", *SMALL, "--candidate", "cache_implementation=static", "--out", str(out))
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())
    assert res["kind"] == "bench" and res["schema_version"] == 1
    assert res["candidate_config"]["cache_implementation"] == "static"
    assert res["stock_config"]["cache_implementation"] == "dynamic"
    pairs = res["protocol"]["pairs"]
    assert 3 <= len(pairs) <= 5
    for pr in pairs:  # raw records: every run produced exactly the tokens asked
        for arm in ("a", "b"):
            assert pr[arm]["success"] and pr[arm]["output_tokens"] == 8 * 16
        assert pr["value_a"] == pytest.approx(pr["a"]["output_tokens"] / pr["a"]["wall_s"])
    assert [p["order"] for p in pairs][:2] == ["AB", "BA"]
    d = res["protocol"]["decision"]
    assert d["ci_low"] <= d["ratio"] <= d["ci_high"]
    assert res["protocol"]["verdict"] in ("keep", "revert", "inconclusive")
    q = res["quality"]
    assert q["evaluated"] and {s["set_name"] for s in q["sets"]} == {"eval", "heldout"}
    # float32 static vs dynamic cache computes the same function on CPU
    assert q["passed"], q["failed"]
    env = res["environment"]
    assert env["versions"]["torch"] and env["versions"]["transformers"] and env["cpu"]
    assert res["timings"]["warmup_stock"] and res["timings"]["timed_runs_s"] > 0
    assert "verdict" in p.stdout and "ratio" in p.stdout
    assert "pair 1/5" in p.stderr  # progress while it runs


@pytest.mark.slow
def test_bench_aa_end_to_end(tmp_path):
    out = tmp_path / "aa.json"
    p = cli("bench", *SMALL, "--aa", "--out", str(out))
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())
    assert res["kind"] == "aa" and len(res["protocol"]["pairs"]) == 5
    assert res["noise"]["sd_log_ratio"] >= 0 and res["quality"]["passed"]
    assert res["verdict"] == "noise-measured"


@pytest.mark.slow
def test_unsupported_candidate_fails_with_a_written_result(tmp_path):
    out = tmp_path / "f.json"
    p = cli("bench", *SMALL, "--candidate", "tf32_matmul=true", "--out", str(out))
    assert p.returncode == 1
    res = json.loads(out.read_text())
    assert res["verdict"] == "failed" and "tf32_matmul" in res["error"]
    assert res["error_kind"] == "unsupported"


@pytest.mark.parametrize("args, needle", [
    (["--concurrency", "0"], "traffic.concurrency"),
    (["--dtype", "fp8"], "dtype"),
    (["--candidate", "warp=9"], "unknown knob"),
    (["--candidate", "cache_implementation"], "expected KEY=VALUE"),
    (["--candidate", "micro_batch=99"], "micro_batch"),
    ([], "needs --candidate"),
])
def test_bad_input_is_one_line_exit_2(args, needle):
    p = cli("bench", "--model", "llama-tiny", "--device", "cpu", *args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    err = p.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1 and needle in err


def test_bad_spec_file_exit_2(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("model: llama-tiny\ntraffic:\n  concurency: 4\n")
    p = cli("validate", str(spec))
    assert p.returncode == 2 and "traffic.concurency" in p.stderr and "unknown key" in p.stderr


def test_knobs_lists_the_space():
    p = cli("knobs", "--model", "llama-tiny", "--device", "cpu")
    assert p.returncode == 0, p.stderr
    for name in ("cache_implementation", "compile_mode", "micro_batch", "prompt_lookup", "tf32_matmul"):
        assert name in p.stdout


def test_every_command_runs_through_its_module():
    """The parser's commands are the CLI's COMMANDS table; each module has ``run``; importing the CLI
    imports none of them (``inferloom --help`` and ``validate`` stay fast)."""
    import importlib

    code = ("import sys, inferloom.cli as c; "
            "print(sorted(m for m in sys.modules if m.startswith(('inferloom.commands.', 'inferloom.phases', "
            "'inferloom.kb', 'inferloom.report'))))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "[]", (p.stdout, p.stderr)
    from inferloom import cli as c

    sub = next(a for a in c.build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == set(c.COMMANDS)
    for name, module in c.COMMANDS.items():
        assert callable(importlib.import_module(module).run), name
