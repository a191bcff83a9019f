"""Paths in a spec resolve against the spec file's folder, for every command; a
configuration that can't work is one line, exit 2, before anything is created;
a session that never measured stock exits 1 and its report's first line says why.

Everything runs from a temporary working directory that is neither the
repository nor the spec's folder."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from custom_helpers import TINY_RUN, git_repo, load_make_demo
from inferloom.cli import main
from inferloom.report.breakdown import breakdown_from_ledger
from inferloom.report.html import render_html
from inferloom.report.markdown import render_report
from inferloom.session import ledger as L
from inferloom.spec import load_spec
from inferloom.spec.paths import SPEC_DIR_PATHS, resolve_spec_paths

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def cli(*args, cwd):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "INFERLOOM_KB": str(Path(cwd) / "kb-unused.sqlite")}
    return subprocess.run([sys.executable, "-m", "inferloom.cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)


def validated(capsys, *argv):
    """``inferloom validate ARGV`` in this process: (exit code, the printed spec or None, stderr)."""
    rc = main(["validate", *argv])
    cap = capsys.readouterr()
    return rc, (yaml.safe_load(cap.out) if rc == 0 else None), cap.err


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A working directory that is neither the repository nor any spec's folder."""
    d = tmp_path / "elsewhere"
    d.mkdir()
    monkeypatch.chdir(d)
    return d


# ------------------------------------------------------------------ the rule
def test_relative_paths_resolve_against_the_spec_folder_and_flags_against_the_cwd(tmp_path, elsewhere):
    folder = tmp_path / "specs"
    (folder / "m").mkdir(parents=True)
    (folder / "m" / "config.json").write_text("{}")
    (folder / "p.jsonl").write_text('{"text": "hi"}\n')
    (folder / "q.jsonl").write_text('{"text": "hi"}\n')
    (folder / "s.yaml").write_text("framework: vllm\nmodel: m\ntraffic: {prompts: p.jsonl}\n"
                                   "quality: {prompts_file: ./q.jsonl}\nserving: {python: ../venv/bin/python}\n")
    spec = load_spec(folder / "s.yaml")
    assert spec.model == str(folder / "m")
    assert spec.traffic.prompts == str(folder / "p.jsonl")
    assert spec.quality.prompts_file == str(folder / "q.jsonl")
    assert spec.serving.python == str(tmp_path / "venv" / "bin" / "python")  # lexical: .. folded, links kept
    # the same file named by a relative path from another folder: the same result
    os.chdir(tmp_path)
    assert load_spec("specs/s.yaml") == spec
    # a flag is relative to the current directory
    (tmp_path / "p2.jsonl").write_text('{"text": "x"}\n')
    assert load_spec("specs/s.yaml", {"traffic.prompts": "p2.jsonl"}).traffic.prompts == str(tmp_path / "p2.jsonl")


def test_names_stay_names(tmp_path):
    data = {"model": "llama-tiny", "traffic": {"prompts": "random"}, "serving": {"python": "python3"},
            "custom": {"repo": "co", "entrypoint": ["python3", "bench.py"], "entrypoint_files": ["bench.py"],
                       "patches": {"dir": "p", "command": ["python3", "spec.py", "--flag", "nothere.py"],
                                   "quality_gate": ["gate.py"]}}}
    (tmp_path / "spec.py").write_text("")
    out = resolve_spec_paths(data, tmp_path)
    assert out["model"] == "llama-tiny" and out["traffic"]["prompts"] == "random"
    assert out["serving"]["python"] == "python3"  # a bare name: PATH, as a shell would
    c = out["custom"]
    assert c["repo"] == str(tmp_path / "co") and c["patches"]["dir"] == str(tmp_path / "p")
    # files inside the checkout stay relative to it: each candidate runs in its own copy
    assert c["entrypoint"] == ["python3", "bench.py"] and c["entrypoint_files"] == ["bench.py"]
    assert c["patches"]["quality_gate"] == ["gate.py"]
    # the Specialist runs in a private temp dir: a file next to the spec is made absolute
    assert c["patches"]["command"] == ["python3", str(tmp_path / "spec.py"), "--flag", "nothere.py"]
    assert data["custom"]["repo"] == "co"  # the caller's mapping is not changed
    assert set(SPEC_DIR_PATHS) >= {"model", "serving.python", "custom.repo", "custom.patches.dir"}


# ------------------------------------------------- every shipped example, from elsewhere
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_each_shipped_example_validates_from_another_directory(path, elsewhere, capsys):
    rc, spec, err = validated(capsys, str(path))
    if path.name.startswith("vllm-tiny-cpu"):
        py = ROOT / ".venv-vllm" / "bin" / "python"  # the repository's, next to examples/
        if not py.exists():  # `make vllm-env` not run here: refused, naming the field and the resolved path
            assert rc == 2 and err.count("\n") == 1 and f"serving.python: {py} does not exist" in err
            return
        assert spec["serving"]["python"] == str(py)
    device_py = ((yaml.safe_load(path.read_text()).get("serving") or {}).get("python") or "")
    if device_py.startswith("/tmp/") and not Path(device_py).exists():  # a GPU machine's bundle wrapper
        assert rc == 2 and err.count("\n") == 1 and f"serving.python: {device_py} does not exist" in err
        return
    assert rc == 0, err
    assert spec["model"] == load_spec(path).model
    assert list(elsewhere.iterdir()) == []  # validate writes nothing


def test_the_custom_example_validates_from_another_directory_with_relative_paths(tmp_path, elsewhere, capsys):
    spec_path = load_make_demo().make_demo(tmp_path / "demo", points=100)
    rc, spec, err = validated(capsys, os.path.relpath(spec_path))
    assert rc == 0, err
    assert spec["custom"]["repo"] == str(tmp_path / "demo" / "checkout")
    # the same spec written with paths relative to its folder
    rel = _relative_custom_spec(spec_path)
    rc, again, err = validated(capsys, os.path.relpath(rel))
    assert rc == 0, err
    assert again["custom"]["repo"] == spec["custom"]["repo"]
    assert again["custom"]["patches"]["dir"] == str(ROOT / "examples" / "custom" / "patches")


def _relative_custom_spec(spec_path: Path) -> Path:
    """``make_demo``'s spec rewritten with repo and patches.dir relative to the spec's folder."""
    data = yaml.safe_load(spec_path.read_text())
    data["custom"]["repo"] = "checkout"
    data["custom"]["patches"]["dir"] = os.path.relpath(data["custom"]["patches"]["dir"], spec_path.parent)
    out = spec_path.with_name("relative.yaml")
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


# ------------------------------------------------- a configuration that can't work: exit 2
def test_a_missing_server_interpreter_is_one_line_exit_2_and_creates_nothing(tmp_path):
    folder = tmp_path / "specs"
    folder.mkdir()
    shutil.copy(ROOT / "examples" / "vllm-tiny-cpu.yaml", folder / "vllm.yaml")  # ../.venv-vllm: not there
    cwd = tmp_path / "work"
    cwd.mkdir()
    p = cli("optimize", "../specs/vllm.yaml", "--budget-minutes", "3", "--out", "s", cwd=cwd)
    want = tmp_path / ".venv-vllm" / "bin" / "python"
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    assert p.stderr.startswith("inferloom optimize: error: serving.python: ") and str(want) in p.stderr
    assert sorted(os.listdir(cwd)) == [] and sorted(os.listdir(folder)) == ["vllm.yaml"]


def test_a_server_module_that_does_not_import_is_exit_2_naming_it(tmp_path, elsewhere):
    # inferloom's own interpreter has no vLLM: a real failed import in "the server's environment"
    spec = elsewhere / "v.yaml"
    spec.write_text(f"framework: vllm\ndevice: cpu\nserving: {{python: {sys.executable}}}\n")
    p = cli("bench", "v.yaml", "--aa", "--out", "r.json", cwd=elsewhere)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "serving.module: `import vllm.entrypoints.openai.api_server` fails in" in p.stderr
    assert sys.executable in p.stderr and "No module named 'vllm'" in p.stderr
    assert sorted(os.listdir(elsewhere)) == ["v.yaml"]


@pytest.mark.parametrize("change, needle", [
    ({"entrypoint": ["./nothere.sh"]}, "custom.entrypoint: ./nothere.sh is not a file committed in"),
    ({"entrypoint": ["/no/such/python", "run.py"]}, "custom.entrypoint: /no/such/python does not exist"),
    ({"entrypoint": ["no-such-command-xyz"]}, "custom.entrypoint: 'no-such-command-xyz' is not a command on PATH"),
    ({"entrypoint_files": ["missing.py"]}, "custom.entrypoint_files: missing.py is not a file committed in"),
    ({"patches": {"command": ["./specialist.sh"]}}, "custom.patches.command: "),
])
def test_a_custom_workload_that_cannot_run_is_exit_2_before_the_session(tmp_path, elsewhere, change, needle):
    git_repo(tmp_path / "specs" / "repo", {"run.py": TINY_RUN})
    custom = {"repo": "repo", "entrypoint": [sys.executable, "run.py"], "entrypoint_files": ["run.py"], **change}
    (tmp_path / "specs" / "c.yaml").write_text(yaml.safe_dump({"framework": "custom", "custom": custom}))
    p = cli("optimize", "../specs/c.yaml", "--out", "s", "--no-kb", cwd=elsewhere)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert needle in p.stderr, p.stderr
    assert list(elsewhere.iterdir()) == []


# ------------------------------------------------- real sessions from another directory
def _tiny_custom(folder: Path, pinned: dict) -> Path:
    git_repo(folder / "repo", {"run.py": TINY_RUN})
    knobs = [{"name": n, "kind": "choice", "choices": c, "default": c[0], "env": n.upper()}
             for n, c in (("speed", ["100", "200"]), ("gate", ["pass", "fail"]), ("mode", ["ok", "exit"]))]
    spec = {"framework": "custom", "device": "cpu", "pinned": pinned,
            "protocol": {"min_pairs": 3, "max_pairs": 3, "bootstrap_resamples": 199},
            "custom": {"repo": "repo", "entrypoint": [sys.executable, "run.py"], "entrypoint_files": ["run.py"],
                       "objective": "items_per_s", "timeout_s": 20, "knobs": knobs}}
    (folder / "c.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return folder / "c.yaml"


def test_a_session_whose_stock_never_ran_exits_1_and_its_report_says_why_first(tmp_path):
    _tiny_custom(tmp_path / "specs", {"mode": "exit"})  # every run of stock exits 3
    cwd = tmp_path / "work"
    cwd.mkdir()
    p = cli("optimize", "../specs/c.yaml", "--budget-minutes", "2", "--max-trials", "2", "--no-kb", "--quiet",
            "--out", "s", cwd=cwd)
    assert p.returncode == 1, p.stderr
    report = (cwd / "s" / "report.md").read_text()
    first = report.splitlines()[0]
    assert first.startswith("# inferloom session report: stock never ran: enablement: stock fails (")
    assert "boom: something broke" in first and "(ledger #" in first
    assert "nothing was kept" not in report and "Nothing was measured against stock" in report
    assert p.stdout.startswith("# inferloom session report: stock never ran: ")  # the CLI prints it first too
    b = json.loads((cwd / "s" / "session_breakdown.json").read_text())
    assert "stock" not in b and b["stock_never_ran"]["measurement_seq"] is not None
    assert main(["report", str(cwd / "s"), "--html"]) == 0
    html = (cwd / "s" / "report.html").read_text()
    assert "<h1>inferloom session report: stock never ran</h1>" in html and "boom: something broke" in html
    r = cli("resume", "s", "--quiet", cwd=cwd)  # a closed session: still the same outcome
    assert r.returncode == 1 and r.stdout.startswith("# inferloom session report: stock never ran: "), r.stderr


def test_a_session_that_measured_stock_and_kept_nothing_exits_0_from_relative_paths(tmp_path):
    _tiny_custom(tmp_path / "specs", {"speed": "100", "gate": "pass", "mode": "ok"})  # no candidate left
    cwd = tmp_path / "work"
    cwd.mkdir()
    p = cli("optimize", "../specs/c.yaml", "--budget-minutes", "2", "--max-trials", "2", "--no-kb", "--quiet",
            "--out", "runs/s", cwd=cwd)
    assert p.returncode == 0, p.stderr
    d = cwd / "runs" / "s"
    assert (d / "report.md").read_text().startswith("# inferloom session report\n")
    assert "Final stack = stock: nothing was kept." in (d / "report.md").read_text()
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["spec"]["custom"]["repo"] == str(tmp_path / "specs" / "repo")  # resolved, absolute
    r = cli("resume", str(d), "--quiet", cwd=tmp_path)  # resume reads the manifest's resolved spec, from anywhere
    assert r.returncode == 0 and r.stdout.startswith("# inferloom session report\n"), r.stderr


def test_the_custom_demo_runs_from_another_directory_with_a_relative_out_and_relative_spec_paths(tmp_path):
    spec = _relative_custom_spec(load_make_demo().make_demo(tmp_path / "demo", points=150, min_pairs=3, max_pairs=3))
    cwd = tmp_path / "work"
    cwd.mkdir()
    p = cli("optimize", os.path.relpath(spec, cwd), "--budget-minutes", "4", "--max-trials", "1", "--no-kb",
            "--no-sweep", "--quiet", "--out", "session", cwd=cwd)
    assert p.returncode == 0, p.stderr
    d = cwd / "session"
    st = json.loads((d / "state.json").read_text())
    kept = st["extra"]["source"]["kept"]
    assert [k["id"] for k in kept] == ["01-vectorize-distances"]
    trees = d / "workspace" / "trees"
    assert (trees / "stack" / "kernel.py").is_file()  # the worktrees are where the layout says, not under repo.git
    assert not (d / "workspace" / "repo.git" / "session").exists()
    branch = st["extra"]["source"]["branch"]
    log = subprocess.run(["git", "-C", str(tmp_path / "demo" / "checkout"), "log", "--oneline", branch],
                         capture_output=True, text=True)
    assert log.returncode == 0 and len(log.stdout.splitlines()) == 2
    assert json.loads((d / "manifest.json").read_text())["spec"]["custom"]["repo"] == str(tmp_path / "demo" / "checkout")
    e = cli("export", "session", "--out", "exported", cwd=cwd)
    assert e.returncode == 0, e.stderr
    series = json.loads((cwd / "exported" / "final_config.json").read_text())["source"]["series"]
    assert series == ["patches/0001-inferloom-KEEP-01-vectorize-distances-vectorize-pair.patch"]  # git format-patch's


@pytest.mark.slow
def test_a_llama_tiny_session_from_another_directory_records_the_resolved_paths(tmp_path):
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "q.jsonl").write_text("".join(json.dumps({"text": f"the quick brown fox jumps over the lazy dog {i}"})
                                            + "\n" for i in range(8)))
    (folder / "s.yaml").write_text("model: llama-tiny\nframework: transformers\ndevice: cpu\n"
                                   "traffic: {concurrency: 2, input_len: 16, output_len: 8, num_prompts: 2}\n"
                                   "quality: {prompts_file: q.jsonl, eval_prompts: 2, heldout_prompts: 2, "
                                   "prompt_len: 8, continuation_len: 4}\n"
                                   "protocol: {min_pairs: 3, max_pairs: 3, bootstrap_resamples: 199}\n"
                                   "kernels: {backend: none}\npinned: {compile_mode: 'off'}\n")
    cwd = tmp_path / "work"
    cwd.mkdir()
    p = cli("optimize", "../specs/s.yaml", "--budget-minutes", "1", "--max-trials", "1", "--no-kb", "--quiet",
            "--no-sweep", "--cycles", "1", "--out", "runs/s", cwd=cwd)
    assert p.returncode == 0, p.stderr
    d = cwd / "runs" / "s"
    m = json.loads((d / "manifest.json").read_text())
    assert m["spec"]["quality"]["prompts_file"] == str(folder / "q.jsonl")
    report = (d / "report.md").read_text()
    assert report.startswith("# inferloom session report\n- Stock: ".replace("\n", "\n\n"))


# ------------------------------------------------- old sessions render as they did
RESULTS = ROOT / "docs" / "results"
# sha256[:16] of (breakdown JSON, report.md, report.html) rendered from each published ledger by main at 3043555,
# before this change: a session that measured stock renders byte for byte as it did
RENDERED = {
    "h200-campaign-2026-11-30/session": ("4a3f32bb7de3304b", "1c8795bcfe24c68c", "ec4a852cd3273ffa"),
    "h200-sessions-2026-11-30/first": ("da349a157d6a919b", "a5be0095dd4fd815", "d11c68609a8abea3"),
    "h200-sessions-2026-11-30/second": ("e4edda2863302433", "46ec7cda96cad287", "05a5bef8248b9f36"),
    # published 2026-12-01, rendered by main at their commit (session 24): from now on they render as they did
    "diffusers-h200-2026-12-01/session": ("38108cb4cc7a2676", "1b458d2b7edfffb2", "2d80b3e87bbceed4"),
    "h200-vllm-2026-12-01-s24/session": ("e6b69f108d5f5c08", "88b807ca71ac3b33", "64ace1c4b1ff6a40"),
    # published 2026-12-01 (session 25, run 3 of docs/benchmarks.md §13), rendered by main at 40fbca3+
    "h200-vllm-2026-12-01-s25/session": ("f141ce93a4ca8cd2", "92e8f9ccac64cb0b", "76c9c94891dd9af1"),
    # published 2026-12-01 (session 27, docs/benchmarks.md §17: the LLM kernel author on one H200)
    "llm-kernel-h200-2026-12-01/session": ("5b59f34f0ebadf0d", "a0cdf77420e4dfb2", "edfc44f07ada3208"),
    # published 2026-12-02 (session 36, docs/benchmarks.md §18: the real SmolLM2 on vLLM, real-text traffic)
    "smollm2-h200-vllm-2026-12-02/s31": ("b84a1eedb3a5ecd2", "5870cd894744a3f7", "e7785b19f14401a4"),
    # published 2026-12-02 (session 37, docs/benchmarks.md §20: the c1 session whose budget ended in PRELUDE)
    "smollm2-h200-vllm-2026-12-02/r2/c1": ("5bb348726f8fa3e4", "e1d3ce4c4271c9a8", "6e055b9b7afcf012"),
    # published 2026-12-03 (session 39, docs/benchmarks.md §21: the trace session (goodput), its budget ended in PRELUDE)
    "smollm2-h200-vllm-2026-12-03/r3/trace": ("8de1c3704c97f2f8", "ed4e2e9a9817cebb", "23654c1b657d5cc4"),
    # published 2026-12-05 (docs/benchmarks.md §22: the first SGLang session on one H200, its budget ended in PRELUDE)
    "sglang-h200-2026-12-05/sg": ("e856962d706bd846", "985bb9602f1a663b", "836874c36f9ae037"),
    # published 2026-12-05 (docs/benchmarks.md §23: SGLang with two trials, and the same day's vLLM session)
    "sglang-h200-2026-12-05/run2/sg": ("36bc95aae91a507d", "87185b44a79a38b2", "7e63eb69136cfabc"),
    "sglang-h200-2026-12-05/run2/vs": ("ef028f44b5adfef8", "a1827191b02fddfb", "61e85a9c893ca6ae"),
    # published 2026-12-05 (docs/benchmarks.md §26: OLMoE on vLLM, one H100, the tuned fused-MoE configs measured)
    "olmoe-h100-2026-12-05/session": ("0be04cefce4ad7ff", "28d84df6ce47f71a", "b5c74deb9828a967"),
    # published 2026-12-06 (docs/benchmarks.md §27: the 8B shape's KERNEL phase through vLLM's plugin, one H100)
    "llama8b-h100-vllm-kernels-2026-12-06/session": ("c2d69889cf65dc63", "326d9bf90816f058", "59f9bb20aee04045"),
    # published 2026-12-06 (docs/benchmarks.md §28: OLMoE on vLLM, one H100: the graph-timed tuning pass, moe_backend)
    "olmoe-h100-vllm-2026-12-06/session": ("bb9487e0ae0b3bb6", "de8b27c03b5bf22b", "d105247f4a0ba05f"),
}


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_published_sessions_render_byte_identically(name):
    d = RESULTS / name
    b = breakdown_from_ledger(L.read_entries(d))
    assert "stock_never_ran" not in b
    manifest = json.loads((d / "manifest.json").read_text())
    b["objective_label"] = "output tok/s"

    def h(s):
        return hashlib.sha256(s.encode()).hexdigest()[:16]

    assert (h(json.dumps(b, sort_keys=True)), h(render_report(b)), h(render_html(b, manifest=manifest))) == RENDERED[name]
    assert sorted(RENDERED) == sorted(str(p.parent.relative_to(RESULTS)) for p in RESULTS.rglob("ledger.jsonl"))
