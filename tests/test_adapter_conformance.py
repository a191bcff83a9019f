"""One conformance class run against every WorkloadAdapter implementation."""

import pytest
import torch

from inferloom.spec import load_spec
from inferloom.workloads.base import ImageOutputs, Knob, RunRecord, WorkloadAdapter, resolve_config


def _synthetic():
    from inferloom.workloads.synthetic import SyntheticAdapter

    return SyntheticAdapter()


def _transformers():
    from inferloom.workloads.transformers_engine import TransformersEngine

    spec = load_spec(None, {"model": "llama-tiny", "device": "cpu", "traffic.concurrency": "2",
                            "traffic.input_len": "8", "traffic.output_len": "4", "traffic.num_prompts": "4"})
    return TransformersEngine(spec)


def _custom(tmp_path_factory):
    from custom_helpers import tiny_custom_spec
    from inferloom.workloads.custom import CustomAdapter

    return CustomAdapter(tiny_custom_spec(tmp_path_factory.mktemp("custom")))


def _diffusers():
    # a real diffusers pipeline (a tiny MMDiT with seeded random weights) on CPU
    from inferloom.workloads.diffusers_engine import DiffusersEngine

    return DiffusersEngine(load_spec(None, {"framework": "diffusers", "model": "sd3-tiny", "device": "cpu",
                                            "diffusion.height": "32", "diffusion.width": "32",
                                            "diffusion.steps": "2"}))


def _vllm(tmp_path_factory):
    # a real vLLM CPU server per prepare (skips, saying why, only without the vLLM environment)
    from _vllm_env import require_vllm, spec_overrides, tiny_model_dir

    from inferloom.workloads.vllm_adapter import VLLMAdapter

    py = require_vllm()
    model = tiny_model_dir(tmp_path_factory.mktemp("vllm-model"))
    spec = load_spec(None, spec_overrides(py, model, **{"traffic.concurrency": "2", "traffic.input_len": "8",
                                                        "traffic.output_len": "4", "traffic.num_prompts": "4",
                                                        "pinned": {}, "serving.extra_args": ["--enforce-eager"]}))
    return VLLMAdapter(spec, tmp_path_factory.mktemp("vllm-logs"))


@pytest.fixture(params=[_synthetic, _transformers, _custom, pytest.param(_vllm, marks=pytest.mark.slow), _diffusers],
                ids=["synthetic", "transformers", "custom", "vllm", "diffusers"], scope="module")
def adapter(request, tmp_path_factory):
    a = request.param(tmp_path_factory) if request.param in (_vllm, _custom) else request.param()
    yield a
    a.close()


class TestConformance:
    def test_is_a_workload_adapter(self, adapter):
        assert isinstance(adapter, WorkloadAdapter)
        assert isinstance(adapter.name, str) and adapter.name

    def test_describe_is_json(self, adapter):
        import json

        json.dumps(adapter.describe())

    def test_knobs_have_stock_values_in_their_domain(self, adapter):
        knobs = adapter.knob_space()
        assert knobs and all(isinstance(k, Knob) for k in knobs)
        assert len({k.name for k in knobs}) == len(knobs)
        for k in knobs:
            assert k.validate(k.default) == k.default
            assert k.applies_to and k.description

    def test_run_returns_a_raw_record_with_exact_tokens(self, adapter):
        h = adapter.prepare(resolve_config(adapter.knob_space(), {}))
        try:
            rec = adapter.run(h, 7)
            assert isinstance(rec, RunRecord) and rec.success, rec.error
            assert rec.seed == 7 and rec.wall_s > 0
            assert rec.output_tokens == rec.expected_output_tokens > 0
            if adapter.name == "vllm":  # the server log is kept under the candidate's id
                assert h.server.log_path.is_file() and h.id in h.server.log_path.name
                pg = h.server.pgid
        finally:
            adapter.release(h)
        if adapter.name == "vllm":  # release stops the whole process group
            from inferloom.workloads.server_process import group_alive

            assert not group_alive(pg)

    def test_prompts_are_seeded(self, adapter):
        assert adapter.prompts(3, 2, 5) == adapter.prompts(3, 2, 5)
        assert adapter.prompts(3, 2, 5) != adapter.prompts(4, 2, 5)
        assert all(len(p) == 5 for p in adapter.prompts(3, 2, 5))

    def test_quality_probes(self, adapter):
        if isinstance(adapter, ImageOutputs):
            # an image generator answers the image contract: the same items give the same images
            h = adapter.prepare(resolve_config(adapter.knob_space(), {}))
            try:
                items = adapter.draw(11, 2)
                assert items == adapter.draw(11, 2) and items != adapter.draw(12, 2)
                out, again = adapter.generate_images(h, items), adapter.generate_images(h, items)
                assert out["images"].shape[0] == 2 and out["images"].shape[-1] == 3
                assert out["trajectory"].shape[:2] == (2, adapter.spec.diffusion.steps)
                assert torch.equal(out["trajectory"][:, -1], out["latents"])
                assert torch.equal(out["images"], again["images"])
                assert 0.0 <= float(out["images"].min()) and float(out["images"].max()) <= 1.0
            finally:
                adapter.release(h)
            return
        if callable(getattr(adapter, "gate_quality", None)):
            # a custom workload answers quality with its own gate, fail-closed, over the timed runs
            h = adapter.prepare(resolve_config(adapter.knob_space(), {}))
            try:
                q = adapter.gate_quality([adapter.run(h, 3), adapter.run(h, 4)])
                assert q["evaluated"] and q["passed"] is True and q["rule"] is None
                assert adapter.gate_quality([])["passed"] is False  # no gate seen: rejected
            finally:
                adapter.release(h)
            return
        h = adapter.prepare(resolve_config(adapter.knob_space(), {}))
        try:
            prompts = adapter.prompts(11, 2, 6)
            conts = adapter.greedy(h, prompts, 3)
            assert len(conts) == 2 and all(len(c) == 3 for c in conts)
            lp = adapter.score(h, prompts, conts)
            assert lp.shape[:2] == (2, 3) and lp.dtype == torch.float32
            assert torch.allclose(lp.exp().sum(-1), torch.ones(2, 3), atol=1e-4)
            # the greedy continuation is (near) the argmax of the teacher-forced distribution
            top = lp.argmax(-1)
            assert (top == torch.tensor(conts)).float().mean() >= 0.5
        finally:
            adapter.release(h)
