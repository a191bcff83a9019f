"""Issue 32's device workflow, on CPU (SGLang does not run here): benchmarks/sglang_lean_bundle.sh packs a
site into parts (its --site mode: a small stand-in site with a ``sglang`` package, a stand-in
``sgl_kernel/flash_ops.abi3.so`` and the other files it drops, instead of the 0.5.17 wheels), and
benchmarks/gpu_sglang_session.sh assembles those parts carried one per call, checks them, unpacks them, writes
the wrapper, adds the FA3 add-on, pins the attention backend without it, and says what is missing. The real
bundle's sizes are measured by the script itself (its header and docs/sglang.md); its device steps are not
run here."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from inferloom.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "benchmarks" / "sglang_lean_bundle.sh"
SESSION = ROOT / "benchmarks" / "gpu_sglang_session.sh"


def _site(root: Path) -> Path:
    """A stand-in site: an importable ``sglang`` (with incompressible padding, so the parts are several),
    sgl_kernel with the files the builder drops, and xgrammar's static library."""
    s = root / "standin-site"
    (s / "sglang").mkdir(parents=True, exist_ok=True)
    (s / "sglang" / "__init__.py").write_text("__version__ = '0.0.bundle'\n# " + os.urandom(6000).hex() + "\n")
    for f in ("sgl_kernel/__init__.py", "sgl_kernel/sm90/common_ops.abi3.so", "sgl_kernel/sm100/common_ops.abi3.so",
              "sgl_kernel/flash_ops.abi3.so", "sgl_kernel/flashmla_ops.abi3.so",
              "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so", "xgrammar/lib/libxgrammar.a",
              "flashinfer/data/cutlass/x.h", "flashinfer/data/build_utils.py", "bin/sglang"):
        (s / f).parent.mkdir(parents=True, exist_ok=True)
        (s / f).write_bytes(os.urandom(3000) if f.endswith("flash_ops.abi3.so") else b"x")
    return s


def _build(repo: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(BUILD), str(repo / ".whl" / "sglang"), "--site", str(_site(repo.parent)), *extra],
                          cwd=repo, env={**os.environ, "PART": "4K", "XZ_THREADS": "1"}, capture_output=True, text=True,
                          timeout=120)


def _call(repo: Path, tmp: Path, carry: list[str], *steps: str) -> subprocess.CompletedProcess:
    """One device call: the working tree holds only the carried folders (the machine's /tmp is tmp)."""
    work = tmp / "call"
    subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir()
    for c in carry:
        (work / c).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-r", str(repo / c), str(work / c)], check=True)
    env = {**os.environ, "OUT": str(tmp / "out"), "VL": str(tmp / "sgl"), "SITE": str(tmp / "site"),
           "VPY": str(tmp / "sglang-py"), "OPTIMIZE_ARGS": ""}
    return subprocess.run(["bash", str(SESSION), *steps], cwd=work, env=env, capture_output=True, text=True, timeout=60)


def test_builder_packs_numbered_parts_with_the_checksum_in_the_last_and_drops_what_it_says(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    r = _build(repo, "--fa3")
    assert r.returncode == 0, r.stdout + r.stderr
    lean = sorted((repo / ".whl" / "sglang").glob("c*"))
    assert len(lean) >= 2 and [c.name for c in lean] == [f"c{i}" for i in range(len(lean))]
    for i, c in enumerate(lean):
        assert (c / f"lean-sglang.tar.xz.part-{i:02d}").is_file()
        assert (c / "SHA256").is_file() == (i == len(lean) - 1)  # the checksum travels with the last part
    assert (lean[-1] / "SHA256").read_text().split()[1] == "lean-sglang.tar.xz"
    fa3 = sorted((repo / ".whl" / "sglang" / "fa3").glob("c*"))
    assert fa3 and (fa3[-1] / "SHA256").read_text().split()[1] == "fa3-sglang.tar.xz"
    dropped = (repo / ".whl" / "sglang" / "dropped.txt").read_text()
    for d in ("sgl_kernel/flash_ops.abi3.so", "sgl_kernel/sm100", "sgl_kernel/flashmla_ops.abi3.so",
              "sgl_kernel/infllm_ops", "xgrammar/lib/libxgrammar.a", "flashinfer/data/cutlass", "bin"):
        assert f"drop {d}" in dropped, d
    r = _build(repo)  # without --fa3 a former add-on goes: the parts on disk are what this build made
    assert r.returncode == 0 and not (repo / ".whl" / "sglang" / "fa3").exists()


def test_bundle_is_assembled_from_parts_carried_one_per_call_with_the_fa3_add_on(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    assert _build(repo, "--fa3").returncode == 0
    lean = sorted(p.name for p in (repo / ".whl" / "sglang").glob("c*"))
    for c in lean[:-1]:
        r = _call(repo, tmp_path, [f".whl/sglang/{c}"], "bundle")
        assert r.returncode == 0 and "SHA256 not yet" in r.stdout, r.stdout + r.stderr
    r = _call(repo, tmp_path, [f".whl/sglang/{lean[-1]}"], "bundle")
    assert r.returncode == 0 and "bundle: sglang 0.0.bundle" in r.stdout and "OK" in r.stdout, r.stdout + r.stderr
    site = tmp_path / "site"
    assert (tmp_path / "sglang-py").read_text() == f"#!/bin/bash\nexport PYTHONPATH={site}\nexec python3 \"$@\"\n"
    assert (site / "sgl_kernel" / "sm90" / "common_ops.abi3.so").is_file()  # Hopper's ops stay
    for gone in ("sgl_kernel/flash_ops.abi3.so", "sgl_kernel/sm100", "xgrammar/lib/libxgrammar.a",
                 "flashinfer/data/cutlass", "bin"):
        assert not (site / gone).exists(), gone
    assert (site / "flashinfer" / "data" / "build_utils.py").is_file() and (site / "BUNDLE-dropped.txt").is_file()
    r = _call(repo, tmp_path, [], "plan", "sg")  # no FA3: stock must be told its attention backend
    assert r.returncode == 0 and "plan: inferloom optimize examples/sglang-h200/llama-3.1-8b-h200-sglang.yaml" in r.stdout
    assert r.stdout.rstrip().endswith("--pin attention_backend=triton"), r.stdout
    fa3 = sorted(p.name for p in (repo / ".whl" / "sglang" / "fa3").glob("c*"))
    for c in fa3:
        r = _call(repo, tmp_path, [f".whl/sglang/fa3/{c}"], "bundle")
        assert r.returncode == 0 and "already runs sglang" in r.stdout, r.stdout + r.stderr
    assert (site / "sgl_kernel" / "flash_ops.abi3.so").stat().st_size == 3000 and "fa3: " + str(site) in r.stdout
    r = _call(repo, tmp_path, [], "bundle")
    assert r.returncode == 0 and "fa3: in" in r.stdout
    r = _call(repo, tmp_path, [], "plan", "sg")  # FA3 there: stock is SGLang's own default, no pin
    assert r.returncode == 0 and "plan: inferloom optimize" in r.stdout and "attention_backend" not in r.stdout


def test_a_part_lost_with_the_machine_is_named_and_a_bad_checksum_refused(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    assert _build(repo).returncode == 0
    last = sorted(p.name for p in (repo / ".whl" / "sglang").glob("c*"))[-1]
    r = _call(repo, tmp_path, [f".whl/sglang/{last}"], "bundle")  # the earlier calls' machine was given back
    assert r.returncode == 1 and "part 00 missing" in r.stdout and "carry the part folders .whl/sglang/c* again" in r.stdout
    subprocess.run(["rm", "-rf", str(tmp_path / "sgl")], check=True)
    for c in sorted((repo / ".whl" / "sglang").glob("c*")):
        p = next(c.glob("lean-sglang.tar.xz.part-*"))
        if c.name == "c0":
            p.write_bytes(b"\0" + p.read_bytes()[1:])  # one byte changed in transit
        r = _call(repo, tmp_path, [f".whl/sglang/{c.name}"], "bundle")
    assert r.returncode == 1 and "checksum failed" in r.stdout and not (tmp_path / "sglang-py").exists()


def test_steps_that_need_the_bundle_say_so_and_check_names_missing_modules(tmp_path):
    for step in (["check"], ["help"], ["profile", "x"], ["session", "x"]):
        r = _call(tmp_path, tmp_path, [], *step)
        assert r.returncode == 1 and "run the bundle step first" in r.stdout, (step, r.stdout)
    r = _call(tmp_path, tmp_path, [], "vllm-row", "vr")
    assert r.returncode == 1 and "vbundle step first" in r.stdout
    repo = tmp_path / "repo"
    repo.mkdir()
    assert _build(repo).returncode == 0
    for c in sorted(p.name for p in (repo / ".whl" / "sglang").glob("c*")):
        _call(repo, tmp_path, [f".whl/sglang/{c}"], "bundle")
    r = _call(repo, tmp_path, [], "check")  # the stand-in has no sglang.srt: each server module is named
    assert r.returncode == 0 and "import sglang.srt.entrypoints.http_server FAILED" in r.stdout, r.stdout
    assert "add each failing import's wheel" in r.stdout
    assert "http_server FAILED" in (tmp_path / "out" / "sglang-import-check.txt").read_text()


@pytest.mark.parametrize("steps", [["nonsense"], [], ["start"], ["plan"]])
def test_unknown_or_no_step_or_no_name_is_refused(tmp_path, steps):
    r = _call(tmp_path, tmp_path, [], *steps)
    assert r.returncode == 2 and ("unknown step" in r.stdout or "Issue 32" in r.stdout or "give the session a NAME"
                                  in r.stdout), r.stdout


def test_builder_refuses_bad_options_in_one_line(tmp_path):
    for args in (["--nope"], ["--site", str(tmp_path / "absent")]):
        r = subprocess.run(["bash", str(BUILD), str(tmp_path / "d"), *args], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and len(r.stdout.strip().splitlines()) == 1 and not (tmp_path / "d").exists(), r.stdout


def test_the_sglang_example_spec_is_the_vllm_workload_on_the_lean_bundles_wrapper():
    sg = load_spec(ROOT / "examples" / "sglang-h200" / "llama-3.1-8b-h200-sglang.yaml")
    vl = load_spec(ROOT / "examples" / "llama-3.1-8b-h200-vllm.yaml")
    assert (sg.framework, sg.serving.python, sg.serving.module) == ("sglang", "/tmp/sglang-py", "sglang.launch_server")
    assert (sg.model, sg.dtype, sg.traffic.concurrency, sg.traffic.input_len, sg.traffic.output_len) == \
        (vl.model, vl.dtype, vl.traffic.concurrency, vl.traffic.input_len, vl.traffic.output_len)


def test_engines_step_detaches_the_real_engine_choice_on_carried_sessions_and_follow_packs_it(tmp_path):
    """`engines NAME A B` then `follow NAME`: the real `inferloom engines` (on two closed sessions of the
    synthetic engine, given as paths as a carried published pair would be) runs as a detached job (the shared
    `detach`), `follow` prints it to its end and packs NAME.tgz; a second start while it runs is refused by name,
    a missing session is named."""
    import sys
    import tarfile

    from inferloom.agents.rules import RuleCritic, RuleOrchestrator, RuleRobustness
    from inferloom.phases.runner import start
    from inferloom.workloads.synthetic import SyntheticAdapter

    base = {"model": "llama-tiny", "framework": "synthetic", "device": "cpu", "protocol.bootstrap_resamples": 999,
            "quality.eval_prompts": 4, "quality.heldout_prompts": 4, "quality.prompt_len": 8,
            "quality.continuation_len": 8}
    dirs = []
    for name, over in (("a", {}), ("b", {"pinned": {"fast_path": False}})):
        spec = load_spec(None, {**base, **over})
        start(tmp_path / name, spec, budget_minutes=10, max_trials=3, adapter=SyntheticAdapter(seed=spec.seed),
              agents={"orchestrator": RuleOrchestrator(seed=0), "critic_factory": RuleCritic,
                      "robustness": RuleRobustness()}, sweep=False)
        dirs.append(str(tmp_path / name))
    env = {**os.environ, "OUT": str(tmp_path / "out"), "SESSIONS": str(tmp_path / "sessions"), "CALL_S": "120",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "ENGINE_PAIRS": "3"}

    def call(*steps):
        return subprocess.run(["bash", str(SESSION), *steps], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=150)

    r = call("engines", "eng", dirs[0], str(tmp_path / "nothing"))
    assert r.returncode == 1 and f"engines: no session in {tmp_path / 'nothing'}" in r.stdout, r.stdout
    (tmp_path / "sessions").mkdir()
    (tmp_path / "sessions" / "busy.pid").write_text(str(os.getpid()))  # a live process: the job runs
    r = call("engines", "busy", *dirs)
    assert r.returncode == 0 and "engines: busy runs already" in r.stdout and not (tmp_path / "sessions" / "busy").exists()
    r = call("engines", "eng", *dirs, "follow", "eng")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(detached; follow eng)" in r.stdout and "follow: eng ended" in r.stdout, r.stdout
    assert "pair 1/3" in r.stdout and "Deploy" in (tmp_path / "sessions" / "eng" / "engines.md").read_text()
    with tarfile.open(tmp_path / "out" / "eng.tgz") as t:
        assert "eng/engines.json" in t.getnames() and "eng/engines_pairs.jsonl" in t.getnames()
    assert "pair 1/3" in (tmp_path / "out" / "eng.log").read_text()
