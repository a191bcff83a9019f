"""Issue 13's device workflow, on CPU: the example vLLM specs load and validate,
and benchmarks/gpu_vllm_session.sh assembles a bundle carried in parts (one
per call), says what is missing, and is idempotent (a small stand-in bundle
holding a ``vllm`` module; the real one is 4 x 60 MiB)."""

from __future__ import annotations

import hashlib
import io
import lzma
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from inferloom.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_vllm_session.sh"


def test_example_vllm_specs_load_and_validate_without_a_gpu():
    tput = load_spec(ROOT / "examples" / "llama-3.1-8b-h200-vllm.yaml")
    assert (tput.framework, tput.model, tput.device, tput.dtype) == ("vllm", "llama-3.1-8b", "cuda", "bfloat16")
    assert (tput.traffic.concurrency, tput.traffic.input_len, tput.traffic.output_len) == (64, 256, 128)
    assert tput.serving.python == "/tmp/vllm-py" and tput.objective == "output_tokens_per_s"
    assert tput.quality.numerics is not None and tput.serving.extra_args == []  # nothing by hand
    good = load_spec(ROOT / "examples" / "llama-3.1-8b-h200-vllm-goodput.yaml")
    assert good.objective == "goodput" and good.serving.arrival == "poisson" and good.serving.request_rate
    assert good.serving.slo_ttft_ms and good.serving.slo_tpot_ms
    kern = load_spec(ROOT / "examples" / "llama-3.1-8b-h200-vllm-kernels.yaml")  # issue 33: the KERNEL phase in vLLM
    assert (kern.model, kern.device, kern.traffic.concurrency) == ("llama-3.1-8b", "cuda", 64)
    assert (kern.kernels.backend, kern.kernels.server_profile, kern.kernels.budget_share) == ("plugin", "always", 0.8)


def _parts(root: Path, n: int) -> None:
    """A stand-in lean bundle: tar.xz of a ``vllm`` package, split into ``n`` part folders c0.. (SHA256 in the last)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"__version__ = '0.0.bundle'\n" + os.urandom(3000).hex().encode().join([b"#", b"\n"])
        info = tarfile.TarInfo("vllm/__init__.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    blob = lzma.compress(buf.getvalue())
    step = -(-len(blob) // n)
    for i in range(n):
        d = root / ".whl" / "vllm" / f"c{i}"
        d.mkdir(parents=True)
        (d / f"lean-vllm.tar.xz.part-{i:02d}").write_bytes(blob[i * step:(i + 1) * step])
    (root / ".whl" / "vllm" / f"c{n - 1}" / "SHA256").write_text(
        f"{hashlib.sha256(blob).hexdigest()}  lean-vllm.tar.xz\n")


def _call(repo: Path, tmp: Path, carry: list[str], *steps: str) -> subprocess.CompletedProcess:
    """One device call: the working tree holds only the carried part folders."""
    work = tmp / "call"
    if work.exists():
        subprocess.run(["rm", "-rf", str(work)], check=True)
    for c in carry:
        (work / c).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-r", str(repo / c), str(work / c)], check=True)
    work.mkdir(exist_ok=True)
    env = {**os.environ, "OUT": str(tmp / "out"), "VL": str(tmp / "vl"), "SITE": str(tmp / "site"),
           "VPY": str(tmp / "vllm-py")}
    return subprocess.run(["bash", str(SCRIPT), *steps], cwd=work, env=env, capture_output=True, text=True, timeout=60)


def test_bundle_step_assembles_parts_carried_one_per_call_and_is_idempotent(tmp_path):
    repo = tmp_path / "repo"
    _parts(repo, 3)
    r = _call(repo, tmp_path, [".whl/vllm/c0"], "bundle")
    assert r.returncode == 0 and "SHA256 not yet" in r.stdout and "carry the next part" in r.stdout, r.stdout + r.stderr
    r = _call(repo, tmp_path, [".whl/vllm/c1"], "bundle")
    assert r.returncode == 0 and "SHA256 not yet" in r.stdout
    r = _call(repo, tmp_path, [".whl/vllm/c2"], "bundle")
    assert r.returncode == 0 and "bundle: vllm 0.0.bundle" in r.stdout, r.stdout + r.stderr
    wrapper = (tmp_path / "vllm-py").read_text()
    assert f"PYTHONPATH={tmp_path / 'site'}/nvidia_cutlass_dsl/dsl_packages:{tmp_path / 'site'}" in wrapper
    r = _call(repo, tmp_path, [], "bundle")
    assert r.returncode == 0 and "already runs vllm" in r.stdout


def test_bundle_step_says_which_part_is_missing_when_the_machine_went_back(tmp_path):
    repo = tmp_path / "repo"
    _parts(repo, 2)
    r = _call(repo, tmp_path, [".whl/vllm/c1"], "bundle")  # c0's call was on a machine since given back
    assert r.returncode == 1 and "part 00 missing" in r.stdout and "carry the part folders .whl/vllm/c* again" in r.stdout
    for step in ("session", "goodput", "profile"):  # every vLLM step says what to do first
        r = _call(repo, tmp_path, [], step, "x")
        assert r.returncode == 1 and "run the bundle step first" in r.stdout, (step, r.stdout)


@pytest.mark.parametrize("steps", [["nonsense"], []])
def test_unknown_or_no_step_is_refused_with_the_usage(tmp_path, steps):
    r = _call(tmp_path, tmp_path, [], *steps)
    assert r.returncode == 2 and ("unknown step" in r.stdout or "Issue 13" in r.stdout)
