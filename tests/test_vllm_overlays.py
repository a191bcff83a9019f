"""Engine overlays without a server: the kernel plugin package (vllm_plugins) and the copy-on-write source
overlay (vllm_source_overlay), built against stand-ins of vLLM's modules; the launch environment they give.
The real server: tests/test_vllm_overlays_real.py."""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inferloom.patches.parse import PatchRefusal
from inferloom.workloads import vllm_plugins as VP
from inferloom.workloads import vllm_source_overlay as VS

DOUBLE = "def forward(self, x, residual=None):\n    return self.stock_forward(x, residual) * 2\n"

# a stand-in for the installed vllm: the custom-op registry and an RMSNorm, as vllm 0.32 has them
FAKE_VLLM = {
    "vllm/__init__.py": "",
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/custom_op.py": (
        "op_registry_oot = {}\n"
        "class CustomOp:\n"
        "    def __new__(cls, *a, **k):\n"
        "        return object.__new__(op_registry_oot.get(cls.__name__, cls))\n"
        "    def forward(self, *a, **k):\n"
        "        return self.forward_cpu(*a, **k)\n"
        "    def forward_cpu(self, *a, **k):\n"
        "        return self.forward_native(*a, **k)\n"
        "    @classmethod\n"
        "    def register_oot(cls, _decorated_op_cls=None, name=None):\n"
        "        _decorated_op_cls.name = name\n"
        "        op_registry_oot[name] = _decorated_op_cls\n"
        "        return _decorated_op_cls\n"),
    "vllm/model_executor/layers/__init__.py": "",
    "vllm/model_executor/layers/layernorm.py": (
        "from vllm.model_executor.custom_op import CustomOp\n"
        "class RMSNorm(CustomOp):\n"
        "    def __init__(self, scale):\n"
        "        self.scale = scale\n"
        "    def forward_native(self, x, residual=None):\n"
        "        return x * self.scale\n"),
    "vllm/banner.py": "MESSAGE = 'stock'\n",
}


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    for rel, text in FAKE_VLLM.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    (site / "vllm/__pycache__").mkdir()
    (site / "vllm/__pycache__/banner.cpython-311.pyc").write_bytes(b"stale bytecode")
    (site / "vllm/__pycache__/__init__.cpython-311.pyc").write_bytes(b"kept")
    return site


def _run(code: str, pythonpath: list[Path], **env: str) -> str:
    full = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **env,
            "PYTHONPATH": os.pathsep.join(map(str, pythonpath)), "PYTHONDONTWRITEBYTECODE": "1"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout + res.stderr


def test_plugin_overlay_is_content_addressed_and_checked(tmp_path):
    ov = VP.build_plugin_overlay(tmp_path, [VP.KernelReplacement("RMSNorm", DOUBLE)])
    assert ov.path.name == f"plugin-{ov.digest[:16]}" and ov.entry_points == (VP.ENTRY_POINT,)
    eps = next(p for p in ov.files if p.endswith("entry_points.txt"))
    assert (ov.path / eps).read_text() == f"[vllm.general_plugins]\n{VP.ENTRY_POINT} = {VP.PLUGIN_PACKAGE}:register\n"
    again = VP.build_plugin_overlay(tmp_path, [VP.KernelReplacement("RMSNorm", DOUBLE)])
    assert again.digest == ov.digest and again.path == ov.path
    assert VP.load_overlay(ov.path).files == ov.files
    other = VP.build_plugin_overlay(tmp_path, [VP.KernelReplacement("RMSNorm", DOUBLE.replace("2", "3"))])
    assert other.digest != ov.digest
    (ov.path / f"{VP.PLUGIN_PACKAGE}/k_rmsnorm.py").write_text(DOUBLE.replace("2", "5"))
    with pytest.raises(VP.EngineOverlayError, match="changed after it was built"):
        VP.verify_overlay(ov)
    with pytest.raises(VP.EngineOverlayError, match="changed after it was built"):
        VP.build_plugin_overlay(tmp_path, [VP.KernelReplacement("RMSNorm", DOUBLE)])
    for bad, msg in (([VP.KernelReplacement("NoSuchOp", DOUBLE)], "not a known vLLM custom op"),
                     ([VP.KernelReplacement("RMSNorm", "x = 1\n")], "defines no top-level"),
                     ([VP.KernelReplacement("RMSNorm", DOUBLE)] * 2, "two kernel replacements"),
                     ([], "at least one")):
        with pytest.raises(VP.EngineOverlayError, match=msg):
            VP.build_plugin_overlay(tmp_path / "x", bad)


def test_launch_env_puts_overlays_on_pythonpath_and_into_a_vllm_plugins_allowlist(tmp_path):
    plug = VP.build_plugin_overlay(tmp_path, [VP.KernelReplacement("RMSNorm", DOUBLE)])
    src = VP.OverlayDir("source", tmp_path / "source-x", "ab" * 32, {})
    assert VP.overlay_env([], {"PYTHONPATH": "/x"}) == {}
    env = VP.overlay_env([plug, src], {})
    assert env["PYTHONPATH"] == f"{src.path}{os.pathsep}{plug.path}"  # the source overlay shadows vllm first
    # a compile cache of their own (vLLM's cache key covers neither), the same for the same overlays
    cache = Path(env["VLLM_CACHE_ROOT"])
    assert cache.parent == tmp_path and cache.name.startswith("vllm-cache-")
    assert VP.overlay_env([src, plug], {})["VLLM_CACHE_ROOT"] == str(cache)
    assert VP.overlay_env([plug], {})["VLLM_CACHE_ROOT"] != str(cache)
    assert VP.overlay_env([plug], {"VLLM_PLUGINS": "theirs"})["VLLM_PLUGINS"] == f"theirs,{VP.ENTRY_POINT}"
    assert VP.overlay_key([]) == "" and VP.overlay_key([plug]) != VP.overlay_key([src])


def test_launch_command_merges_the_overlay_env_after_dropping_the_callers_pythonpath(tmp_path, monkeypatch):
    from inferloom.spec import load_spec
    from inferloom.workloads.vllm_launch import launch_command

    monkeypatch.setenv("PYTHONPATH", "/inferloom/own/path")
    spec = load_spec(None, {"framework": "vllm", "device": "cpu", "model": "llama-tiny"})
    plug = VP.build_plugin_overlay(tmp_path, [VP.KernelReplacement("RMSNorm", DOUBLE)])
    _, env, origin = launch_command(spec, "/m", {}, 8000)
    assert "PYTHONPATH" not in env and "overlays" not in origin
    _, env, origin = launch_command(spec, "/m", {}, 8000, overlays=[plug])
    assert env["PYTHONPATH"] == str(plug.path) and origin["overlays"][0]["digest"] == plug.digest
    assert env["VLLM_CACHE_ROOT"].startswith(str(tmp_path))


def test_the_generated_plugin_registers_a_replacement_that_vllms_registry_builds(tmp_path):
    """Entry-point discovery over sys.path finds the overlay's dist-info; its register() replaces RMSNorm by
    a subclass whose forward runs the replacement (and counts calls into the trace); logs its line."""
    site = _site(tmp_path)
    ov = VP.build_plugin_overlay(tmp_path / "ov", [VP.KernelReplacement("RMSNorm", DOUBLE)])
    trace = tmp_path / "trace.jsonl"
    out = _run("import importlib.metadata as m\n"
               "eps = [e for e in m.entry_points(group='vllm.general_plugins')]\n"
               "print('eps', [(e.name, e.value) for e in eps])\n"
               "eps[0].load()()\n"
               "eps[0].load()()  # loaded again in the same process: registers once\n"
               "from vllm.model_executor.layers.layernorm import RMSNorm\n"
               "n = RMSNorm(3.0)\n"
               "print('type', type(n).__module__, isinstance(n, RMSNorm), n.scale)\n"
               "print('out', [n.forward(1.0) for _ in range(5)])\n",
               [ov.path, site], INFERLOOM_PLUGIN_TRACE=str(trace))
    assert f"eps [('{VP.ENTRY_POINT}', '{VP.PLUGIN_PACKAGE}:register')]" in out
    assert "type inferloom_vllm_plugin True 3.0" in out and "out [6.0, 6.0, 6.0, 6.0, 6.0]" in out
    assert out.count(VP.REGISTERED) == 1
    pids = VP.check_plugin_log(out, ov)
    assert len(pids) == 1
    recs = VP.read_trace(trace)
    assert recs[0] == {"event": "registered", "ops": ["RMSNorm"], "pid": pids[0]}
    assert [r["calls"] for r in recs[1:]] == [1, 2, 4]


def test_a_server_log_without_the_registration_is_refused(tmp_path):
    ov = VP.build_plugin_overlay(tmp_path, [VP.KernelReplacement("RMSNorm", DOUBLE)])
    with pytest.raises(VP.EngineOverlayError, match="ran stock kernels"):
        VP.check_plugin_log("INFO all fine\n", ov)
    with pytest.raises(VP.EngineOverlayError, match="failed to load the plugin"):
        VP.check_plugin_log(f"ERROR Failed to load plugin {VP.ENTRY_POINT}\nTraceback ...\n", ov)
    assert VP.check_overlays([], tmp_path / "none.log") == {}


def _diff(site: Path, rel: str, new: str) -> bytes:
    old = (site / rel).read_text()
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{rel}", f"b/{rel}")).encode()


def test_source_overlay_shadows_the_package_with_links_and_patched_copies(tmp_path):
    site = _site(tmp_path)
    before = {p: p.read_bytes() for p in site.rglob("*") if p.is_file()}
    patch = _diff(site, "vllm/banner.py", "MESSAGE = 'patched'\n")
    ov = VS.build_source_overlay(tmp_path / "ov", site / "vllm", patch)
    assert ov.kind == "source" and set(ov.files) == {"vllm/banner.py"}
    farm = ov.path / "vllm"
    assert not (farm / "banner.py").is_symlink() and (farm / "banner.py").read_text() == "MESSAGE = 'patched'\n"
    assert (farm / "model_executor/layers/layernorm.py").is_symlink()
    assert not (farm / "model_executor").is_symlink()  # real directories: bytecode is written here, not there
    assert (farm / "__pycache__/__init__.cpython-311.pyc").is_symlink()
    assert not (farm / "__pycache__/banner.cpython-311.pyc").exists()  # a patched module's stale bytecode
    assert ov.info["base"]["vllm/banner.py"] and ov.info["patch"]["changed_lines"] == 2
    code = "import vllm.banner as b, vllm.model_executor.layers.layernorm as l; print(b.MESSAGE, l.__file__)"
    out = _run(code, [ov.path, site])
    assert out.startswith("patched ") and str(ov.path) in out
    assert _run(code, [site]).startswith("stock ")  # rollback: the launch without the overlay
    assert VS.build_source_overlay(tmp_path / "ov", site / "vllm", patch).path == ov.path  # same patch, same dir
    assert {p: p.read_bytes() for p in site.rglob("*") if p.is_file()} == before  # the installed tree untouched
    VS.check_base(ov)
    (site / "vllm/banner.py").write_text("MESSAGE = 'upgraded'\n")
    with pytest.raises(VP.EngineOverlayError, match="changed since the patch"):
        VS.check_base(ov)
    VS.drop_overlay(ov)
    assert not ov.path.exists()


def test_source_overlay_can_add_a_module(tmp_path):
    site = _site(tmp_path)
    patch = b"--- /dev/null\n+++ b/vllm/extra.py\n@@ -0,0 +1 @@\n+X = 7\n"
    ov = VS.build_source_overlay(tmp_path / "ov", site / "vllm", patch)
    assert _run("import vllm.extra as e; print(e.X)", [ov.path, site]).strip() == "7"
    assert not (site / "vllm/extra.py").exists()


@pytest.mark.parametrize("patch,rule", [
    (b"--- a/tests/test_x.py\n+++ b/tests/test_x.py\n@@ -1 +1 @@\n-a\n+b\n", "outside_allowlist"),
    (b"--- a/vllm/../evil.py\n+++ b/vllm/../evil.py\n@@ -1 +1 @@\n-a\n+b\n", "path_traversal"),
    (b"--- a/vllm/banner.py\n+++ b/vllm/banner.py\n@@ -1 +1 @@\n-MESSAGE = 'other'\n+MESSAGE = 'x'\n", "does_not_apply"),
    (b"--- a/vllm/missing.py\n+++ b/vllm/missing.py\n@@ -1 +1 @@\n-a\n+b\n", "does_not_apply"),
    (b"not a diff\n", "malformed_diff"),
])
def test_source_overlay_refusals_name_their_rule(tmp_path, patch, rule):
    site = _site(tmp_path)
    with pytest.raises(PatchRefusal) as ei:
        VS.build_source_overlay(tmp_path / "ov", site / "vllm", patch)
    assert ei.value.rule == rule
    assert not (tmp_path / "ov").exists() or not any((tmp_path / "ov").iterdir())


def test_the_installed_package_is_found_without_importing_it(tmp_path):
    site = _site(tmp_path)
    (site / "vllm/__init__.py").write_text("raise SystemExit('imported')\n")
    env_py = tmp_path / "py"
    env_py.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    env_py.chmod(0o755)
    assert VS.installed_package(str(env_py)) == site / "vllm"
    with pytest.raises(VP.EngineOverlayError, match="no package 'nosuchpkg'"):
        VS.installed_package(sys.executable, "nosuchpkg")
    assert json.loads(json.dumps(VP.OverlayDir("plugin", tmp_path, "d", {}).to_dict()))["kind"] == "plugin"


def test_a_rebuild_from_the_sessions_files_must_give_the_recorded_overlay(tmp_path):
    ov = VP.build_plugin_overlay(tmp_path / "session", [VP.KernelReplacement("RMSNorm", DOUBLE)])
    recorded = json.loads(json.dumps(ov.to_dict()))  # as a ledger keeps it
    again = VP.build_plugin_overlay(tmp_path / "remeasure", [VP.KernelReplacement("RMSNorm", DOUBLE)])
    VP.check_rebuilt(again, recorded)
    other = VP.build_plugin_overlay(tmp_path / "remeasure", [VP.KernelReplacement("RMSNorm", DOUBLE + "# x\n")])
    with pytest.raises(VP.EngineOverlayError, match="k_rmsnorm.py"):
        VP.check_rebuilt(other, recorded)
    site = _site(tmp_path)
    lines = [f"X{i} = {i}\n" for i in range(12)]
    (site / "vllm/long.py").write_text("".join(lines))
    patch = _diff(site, "vllm/long.py", "".join(["X0 = 'patched'\n"] + lines[1:]))
    src = VS.build_source_overlay(tmp_path / "session", site / "vllm", patch)
    VP.check_rebuilt(VS.build_source_overlay(tmp_path / "remeasure", site / "vllm", patch), src.to_dict())
    (site / "vllm/long.py").write_text("".join(lines[:-1] + ["X11 = 'v2'\n"]))  # another installation
    with pytest.raises(VP.EngineOverlayError, match="digest"):
        VP.check_rebuilt(VS.build_source_overlay(tmp_path / "remeasure", site / "vllm", patch), src.to_dict())


class _FakeServer:
    def __init__(self, log_path):
        self.log_path, self.stopped = log_path, False

    def alive(self):
        return not self.stopped

    def stop(self):
        self.stopped = True
        return {"stopped": True}


@pytest.mark.parametrize("log,ok", [(None, True), ("INFO stock kernels only\n", False),
                                    (f"ERROR Failed to load plugin {VP.ENTRY_POINT}\n", False)])
def test_the_adapter_refuses_a_server_whose_plugin_did_not_register(tmp_path, monkeypatch, log, ok):
    """vLLM starts without a plugin it could not load: such a server is stopped and the start refused
    (kind engine_overlay), never measured as if it ran the candidate's kernel."""
    from inferloom.spec import load_spec
    from inferloom.workloads import server_adapter as SA
    from inferloom.workloads import vllm_adapter as VA
    from inferloom.workloads.base import AdapterError
    from inferloom.workloads.vllm_servers import VLLMHandle

    plug = VP.build_plugin_overlay(tmp_path, [VP.KernelReplacement("RMSNorm", DOUBLE)])
    logf = tmp_path / "server.log"
    logf.write_text(log if log is not None else f"{VP.REGISTERED} RMSNorm digest={plug.info['tag']} pid=42\n")
    servers = []

    def fake_start(hid, cfg, cid, launch, port, log_path, *a, **k):
        servers.append(_FakeServer(logf))
        return VLLMHandle(hid, cfg, cid, servers[-1], 1.0, notes={"log": str(logf)}), {"server_startup_s": 1.0}

    monkeypatch.setattr(SA, "start_server", fake_start)  # the server base starts every engine's server
    a = VA.VLLMAdapter(load_spec(None, {"framework": "vllm", "device": "cpu", "model": "llama-tiny"}), tmp_path)
    monkeypatch.setattr(a, "launch_argv", lambda cfg, port: ([], {}, {}))
    a.set_overlays([plug])
    if ok:
        h, record = a._start({}, "new")
        assert record["overlays_registered"] == {plug.digest[:16]: [42]} and h.server.alive()
    else:
        with pytest.raises(AdapterError) as ei:
            a._start({}, "new")
        assert ei.value.kind == "engine_overlay" and servers[0].stopped and not a._handles


def _native_rms_norm(x, residual, weight, eps):
    """vLLM 0.32's native rms_norm / fused_add_rms_norm (vllm/ir/ops/layernorm.py), the CPU stock."""
    import torch

    dtype = x.dtype
    h = x.to(torch.float32)
    if residual is not None:
        h = h + residual.to(torch.float32)
        residual = h.to(dtype)
    h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)
    out = (h.to(weight.dtype) * weight).to(dtype)
    return out if residual is None else (out, residual)


def test_the_torch_rmsnorm_replacement_matches_vllms_native_rmsnorm():
    import types

    import torch

    from inferloom.workloads.vllm_replacements import torch_rmsnorm

    r = torch_rmsnorm()
    ns: dict = {}
    exec(compile(r.source, r.module(), "exec"), ns)
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(5, 64, generator=g).to(dtype)
        res = torch.randn(5, 64, generator=g).to(dtype)
        w = (torch.rand(64, generator=g) + 0.5).to(dtype)
        layer = types.SimpleNamespace(variance_size_override=None, has_weight=True, variance_epsilon=1e-6, weight=w,
                                      stock_forward=lambda *a: "stock")
        out = ns["forward"](layer, x)
        ref = _native_rms_norm(x, None, w, 1e-6)
        assert out.dtype == dtype and torch.allclose(out.float(), ref.float(), atol=1e-2 if dtype != torch.float32 else 1e-5)
        (o2, r2), (ref2, rref2) = ns["forward"](layer, x, res), _native_rms_norm(x, res, w, 1e-6)
        assert torch.equal(r2, rref2) and torch.allclose(o2.float(), ref2.float(), atol=1e-2 if dtype != torch.float32 else 1e-5)
        layer.variance_size_override = 32
        assert ns["forward"](layer, x) == "stock"  # not covered: the stock method
