"""The deploy command (issue 31, item 5): the final stack as a user runs it, in report.md / report.html
(a Deploy section) and in ``inferloom export`` (deploy.md; deploy.sh for a server)."""

from __future__ import annotations

import json
import shlex
import shutil

import pytest

from inferloom.cli import main
from inferloom.report.deploy import deploy_lines, session_deploy
from inferloom.spec import load_spec
from inferloom.workloads.deploy import preset_server_dir, shell_command, vllm_deploy
from inferloom.workloads.vllm_launch import launch_command, server_distribution, server_model_dir

SESSION = ["optimize", "--model", "llama-tiny", "--framework", "synthetic", "--device", "cpu", "--seed", "3",
           "--budget-minutes", "5", "--max-trials", "3", "--no-sweep", "--quiet", "--no-kb"]


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    d = tmp_path_factory.mktemp("deploy") / "s"
    assert main([*SESSION, "--out", str(d)]) == 0
    return d


def _as(d, spec, stack, stock=None, dist=None):
    """Session ``d`` as if it had run ``spec`` and kept ``stack`` (the manifest's spec, state.json's stack)."""
    m = json.loads((d / "manifest.json").read_text())
    m["spec"] = spec.model_dump(mode="json")
    m["adapter"]["server_distribution"] = dist
    (d / "manifest.json").write_text(json.dumps(m))
    st = json.loads((d / "state.json").read_text())
    st["stack"], st["stock_config"] = stack, stock if stock is not None else dict(stack)
    (d / "state.json").write_text(json.dumps(st))
    lines = []
    for line in (d / "ledger.jsonl").read_text().splitlines():  # and the close entry's, which the report reads
        e = json.loads(line)
        if e["kind"] == "close":
            e["final_config"], e["stock_config"] = st["stack"], st["stock_config"]
        lines.append(json.dumps(e))
    (d / "ledger.jsonl").write_text("\n".join(lines) + "\n")


def test_a_synthetic_session_reports_and_exports_its_final_knobs(session, tmp_path):
    d = tmp_path / "s"
    shutil.copytree(session, d)
    st = json.loads((d / "state.json").read_text())
    md = (d / "report.md").read_text()
    assert "\n## Deploy\n" in md and "```python\nfinal_config = {" in md
    for k, v in st["stack"].items():
        assert f"    {k!r}: {v!r}," in md
    assert main(["report", str(d), "--html"]) == 0 and (d / "report.md").read_text() == md  # re-rendered: the same
    assert '<section id="deploy"><h2>Deploy</h2>' in (d / "report.html").read_text()
    assert main(["export", str(d)]) == 0
    dep = (d / "export" / "deploy.md").read_text()
    assert "final_config = {" in dep and not (d / "export" / "deploy.sh").exists()
    assert "deploy.md" in (d / "export" / "README.md").read_text()


def test_the_transformers_settings_are_the_knobs_with_what_each_does(session, tmp_path):
    d = tmp_path / "s"
    shutil.copytree(session, d)
    spec = load_spec(None, {"framework": "transformers", "model": "llama-tiny", "device": "cpu"})
    stock = {"dtype": "float32", "attn_implementation": "sdpa", "cache_implementation": "dynamic", "compile_mode": "off",
             "micro_batch": 8}
    _as(d, spec, {**stock, "cache_implementation": "static", "micro_batch": 16}, stock)
    dep = session_deploy(d)
    assert dep["kind"] == "settings" and dep["lang"] == "python"
    code = dep["code"].splitlines()
    assert code[0] == "final_config = {" and code[-1] == "}"
    static = next(x for x in code if x.startswith("    'cache_implementation': 'static',"))
    assert "  # " in static  # what the knob does, from the engine's knob table
    assert "    'micro_batch': 16," in "\n".join(code)
    text = "\n".join(deploy_lines(dep))
    assert "Changed from stock: `cache_implementation=static`, `micro_batch=16`." in text


def test_the_vllm_command_is_what_inferloom_ran_less_host_and_port(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERLOOM_CACHE", str(tmp_path / "cache"))
    spec = load_spec(None, {"framework": "vllm", "model": "llama-tiny", "device": "cpu",
                            "serving.python": "/opt/v/bin/python", "serving.extra_args": ["--trust-request-chat-template"],
                            "serving.env": {"OMP_NUM_THREADS": "4"},
                            "pinned": {"enforce_eager": True}})
    spec.serving.env["HF_TOKEN"] = "hf_secret123"  # a spec refuses one; were one there, it is never printed
    final = {"max_num_seqs": 8, "async_scheduling": True, "prefix_caching": "off", "kv_cache_space_gib": 2,
             "attention_backend": "default", "enforce_eager": False}
    dep = vllm_deploy(spec, final, {"adapter": {"server_distribution": "vllm 0.26.0"}}, [])
    model = preset_server_dir(spec)
    argv, env, _ = launch_command(spec, model, {**final, "enforce_eager": True}, 4321)
    i = argv.index("--host")
    assert argv[i:i + 4] == ["--host", "127.0.0.1", "--port", "4321"]
    want = ["vllm", "serve", model, *argv[5:i], *argv[i + 4:]]  # python -m MODULE --model DIR -> vllm serve DIR
    words = shlex.split(dep["code"])
    assert words[:3] == ["HF_TOKEN=***", "OMP_NUM_THREADS=4", "VLLM_CPU_KVCACHE_SPACE=2"] and words[3:] == want
    assert "hf_secret123" not in json.dumps(dep) and "--port" not in words and "--host" not in words
    for flag in ("--max-num-seqs", "--async-scheduling", "--no-enable-prefix-caching", "--enforce-eager",
                 "--trust-request-chat-template", "--served-model-name"):
        assert flag in words
    exact = next(n for n in dep["notes"] if n.startswith("Exactly what inferloom ran"))
    assert "/opt/v/bin/python -m vllm.entrypoints.openai.api_server --model" in exact
    # vllm-cpu (its `vllm` entry point is broken) or a distribution not recorded: the exact form leads
    for dist in ("vllm-cpu 0.32.0", None):
        cpu = vllm_deploy(spec, final, {"adapter": {"server_distribution": dist}}, [])
        words = shlex.split(cpu["code"])
        assert words[3:] == [*argv[:i], *argv[i + 4:]] and words[3:6] == ["/opt/v/bin/python", "-m", spec.serving.module]
        assert any("vllm serve" in n for n in cpu["notes"])
    # the preset's directory is the one the server loaded (no model written by a report)
    assert not (tmp_path / "cache").exists()
    (tmp_path / "cache" / "server-models" / "llama-tiny-seed0-float32").mkdir(parents=True)
    ((tmp_path / "cache" / "server-models" / "llama-tiny-seed0-float32" / "config.json")).write_text("{}")
    assert server_model_dir(spec, print) == model == str(tmp_path / "cache/server-models/llama-tiny-seed0-float32")
    assert shell_command({"A_KEY": "x"}, ["a b"]) == "A_KEY='***' 'a b'"


@pytest.mark.slow
def test_a_real_vllm_cpu_server_starts_from_the_exported_command(session, tmp_path):
    """export's deploy.sh (``vllm serve ...``), with ``--host 127.0.0.1 --port FREE`` added as deploy.md says,
    starts a real vllm-cpu server that answers a completion."""
    import os
    import signal
    import subprocess
    import urllib.request
    from pathlib import Path

    from _vllm_env import require_vllm, spec_overrides, tiny_model_dir, wait_health

    from inferloom.workloads.server_process import free_port

    py = require_vllm()
    model = tiny_model_dir(tmp_path)
    spec = load_spec(None, spec_overrides(py, model, **{"serving.env": {"VLLM_CPU_KVCACHE_SPACE": "1"}}))
    d = tmp_path / "s"
    shutil.copytree(session, d)
    stack = {"max_num_seqs": 4, "enforce_eager": True}
    _as(d, spec, stack, {"max_num_seqs": 0, "enforce_eager": True}, server_distribution(py))
    assert main(["export", str(d)]) == 0
    sh, md = d / "export" / "deploy.sh", (d / "export" / "deploy.md").read_text()
    cmd = md.split("```sh\n", 1)[1].split("\n```", 1)[0]
    assert server_distribution(py).startswith("vllm-cpu ")  # its `vllm` entry point is broken: the exact form
    assert cmd.startswith(f"VLLM_CPU_KVCACHE_SPACE=1 {py} -m vllm.entrypoints.openai.api_server --model {model} ")
    assert "--max-num-seqs 4" in cmd and "--port" not in cmd
    assert cmd in sh.read_text() and os.access(sh, os.X_OK)
    port = free_port()
    env = {**os.environ, "PATH": f"{Path(py).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen([str(sh), "--host", "127.0.0.1", "--port", str(port)], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_health(proc, port, tmp_path / "server.log", 240)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"model": "inferloom-model", "prompt": "The capital of",
                                                      "max_tokens": 8, "temperature": 0}).encode())
        out = json.loads(urllib.request.urlopen(req, timeout=120).read())
        assert out["choices"][0]["finish_reason"] in ("length", "stop") and out["usage"]["completion_tokens"] > 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()
