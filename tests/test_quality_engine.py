"""The quality contract against the real transformers engine (llama-tiny, CPU)."""

import pytest
import torch

from inferloom.measure import quality as Q
from inferloom.spec import load_spec
from inferloom.workloads.transformers_engine import TransformersEngine


@pytest.fixture(scope="module")
def setup():
    spec = load_spec(None, {"model": "llama-tiny", "device": "cpu", "quality.eval_prompts": "6",
                            "quality.prompt_len": "16", "quality.continuation_len": "16"})
    eng = TransformersEngine(spec)
    stock = eng.prepare({})
    ref = Q.capture_reference(eng, stock, "eval", Q.quality_prompt_sets(spec, eng)["eval"], 16)
    yield eng, ref
    eng.close()


def test_equivalent_candidate_passes(setup):
    eng, ref = setup
    h = eng.prepare({"cache_implementation": "static"})
    v = Q.evaluate(eng, h, ref, Q.QualityThresholds())
    eng.release(h)
    assert v.passed, v.message
    assert v.details["reference"]["tie_margin_used"] == pytest.approx(0.1)  # fp32: path noise ~1e-5


@pytest.mark.parametrize("scale", [0.3, 0.05])
def test_corrupted_weights_fail_and_name_the_check(setup, scale):
    """A stand-in for a wrong kernel: same config, one projection perturbed."""
    eng, ref = setup
    h = eng.prepare({})
    w = h.model.model.layers[1].mlp.down_proj.weight
    with torch.no_grad():
        w.add_(torch.randn(w.shape, generator=torch.Generator().manual_seed(0)) * w.std() * scale * 10)
    v = Q.evaluate(eng, h, ref, Q.QualityThresholds())
    eng.release(h)
    assert not v.passed
    assert v.failed_check in ("top1_agreement", "mean_kl", "greedy_agreement")
    assert v.failed_check in v.message


def test_bf16_path_noise_widens_the_margin_only_by_stock_noise():
    spec = load_spec(None, {"model": "llama-tiny", "device": "cpu", "dtype": "bfloat16",
                            "quality.eval_prompts": "4", "quality.prompt_len": "16", "quality.continuation_len": "16"})
    eng = TransformersEngine(spec)
    try:
        stock = eng.prepare({})
        ref = Q.capture_reference(eng, stock, "eval", Q.quality_prompt_sets(spec, eng)["eval"], 16)
        assert ref.path_noise_nats is not None and 0 < ref.path_noise_nats < 1.0
        margin = Q.effective_tie_margin(ref, Q.QualityThresholds())
        assert margin == max(0.1, Q.PATH_NOISE_FACTOR * ref.path_noise_nats)
    finally:
        eng.close()


def test_path_gap_noise_is_zero_for_identical_paths():
    lp = torch.log_softmax(torch.randn(2, 3, 10), -1)
    assert Q.path_gap_noise(lp, lp.clone()) == 0.0
    other = lp.clone()
    other[..., :] += 0.0
    top2 = lp.topk(2, -1).indices
    other.scatter_add_(-1, top2[..., :1], torch.full((2, 3, 1), 0.2))
    assert Q.path_gap_noise(other, lp) == pytest.approx(0.2, abs=1e-6)
