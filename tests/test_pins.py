"""The pin ledger in the manifest: every package with its version (and hash where pip knows it), Python,
torch, CUDA, driver, GPU, the model files' sha256, kernel cache entries, the server's version, the spec's hash."""

import hashlib
import json
import os
import platform
from importlib import metadata

import pytest

from inferloom.phases.runner import start
from inferloom.pins import file_sha256, hash_cache_path, model_files, packages, pin_ledger
from inferloom.session.manifest import read_manifest
from inferloom.spec import spec_hash
from test_session import SPEC, agents, two_knob_adapter


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERLOOM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("INFERLOOM_KERNEL_CACHE", str(tmp_path / "kcache"))


def test_a_real_session_manifest_holds_the_pin_ledger(tmp_path):
    d = tmp_path / "s"
    start(d, SPEC, budget_minutes=5, max_trials=1, adapter=two_knob_adapter(), agents=agents(), sweep=False,
          kb_url=None)
    pins = read_manifest(d)["pins"]
    assert pins["spec_hash"] == spec_hash(SPEC)
    assert pins["python"]["version"] == platform.python_version()
    by_name = {p["name"].lower(): p for p in pins["packages"]}
    for name in ("pydantic", "numpy", "torch", "scipy"):
        assert by_name[name]["version"] == metadata.version(name), name
    rec = metadata.distribution("pydantic").read_text("RECORD")
    assert by_name["pydantic"]["record_sha256"] == hashlib.sha256(rec.encode()).hexdigest()
    import torch
    assert pins["torch"]["version"] == torch.__version__ and pins["torch"]["cuda"] == torch.version.cuda
    assert pins["model"]["kind"] == "preset" and "seed" in pins["model"]["note"]
    assert pins["server"] is None
    assert pins["kernel_cache"]["tuning"] == []


def test_model_files_are_hashed_once_and_rehashed_when_changed(tmp_path):
    m = tmp_path / "model"
    m.mkdir()
    (m / "config.json").write_text('{"a": 1}')
    (m / "weights.safetensors").write_bytes(b"\x00" * 4096)
    got = pin_ledger(model=str(m), spec_hash="h", gpu={})["model"]
    assert got["kind"] == "directory"
    assert {f["name"]: f["sha256"] for f in got["files"]} == {
        "config.json": hashlib.sha256(b'{"a": 1}').hexdigest(),
        "weights.safetensors": hashlib.sha256(b"\x00" * 4096).hexdigest()}
    cache = json.loads(hash_cache_path().read_text())
    assert str((m / "weights.safetensors").resolve()) in cache
    # an unchanged file (same size and mtime) is not read again: its cached hash is used
    key = str((m / "config.json").resolve())
    cache[key]["sha256"] = "cached"
    assert file_sha256(m / "config.json", cache) == "cached"
    # a changed file (new size, mtime) is hashed again
    (m / "config.json").write_text('{"a": 22}')
    os.utime(m / "config.json", ns=(1, 1))
    assert model_files(str(m), cache)["files"][0]["sha256"] == hashlib.sha256(b'{"a": 22}').hexdigest()


def test_kernel_cache_entries_and_server_version_are_pinned(tmp_path):
    tuning = tmp_path / "kcache" / "kernel_tuning"
    tuning.mkdir(parents=True)
    (tuning / "cpu.json").write_text(json.dumps({"k1": {}, "k2": {}}))
    desc = {"server_python": "/x/bin/python", "server_module": "vllm.entrypoints.openai.api_server",
            "server_distribution": "vllm 0.11.0"}
    pins = pin_ledger(model="llama-tiny", spec_hash="h", gpu={"name": "G", "driver": "570.1"},
                      adapter_description=desc)
    assert pins["kernel_cache"]["tuning"] == [{"file": "cpu.json", "entries": 2,
                                              "sha256": file_sha256(tuning / "cpu.json")}]
    assert pins["server"] == {"python": "/x/bin/python", "module": "vllm.entrypoints.openai.api_server",
                              "distribution": "vllm 0.11.0"}
    assert pins["torch"]["driver"] == "570.1" and pins["torch"]["gpu"]["name"] == "G"


def test_packages_carry_what_pip_knows_of_their_origin():
    rows = packages()
    assert [r["name"].lower() for r in rows] == sorted(r["name"].lower() for r in rows)
    names = {r["name"].lower() for r in rows}
    assert {"pydantic", "sqlalchemy", "rich"} <= names
    # every row with a direct_url.json records its url; an archive install records the archive's hash
    for r in rows:
        d = metadata.distribution(r["name"]).read_text("direct_url.json")
        if d:
            assert r.get("url") == json.loads(d).get("url")
