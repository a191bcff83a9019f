"""framework: diffusers: the spec section, the knob rules, the image quality
contract's pure functions, the per-step costs and roofline, the KB key, and a
real tiny pipeline on CPU (an MMDiT with seeded random weights, 32x32, 2 steps)."""

import numpy as np
import pytest
import torch

from inferloom.kb.key import WorkloadKey
from inferloom.measure import image_quality as IQ
from inferloom.measure import quality as Q
from inferloom.measure.diffusion_costs import diffusion_costs, image_roofline
from inferloom.spec import SpecError, load_spec
from inferloom.workloads.base import AdapterError, ConfigError, resolve_config

TINY = {"framework": "diffusers", "model": "sd3-tiny", "device": "cpu", "diffusion.height": "32",
        "diffusion.width": "32", "diffusion.steps": "2", "quality.eval_prompts": "2", "quality.heldout_prompts": "2"}


def _spec(**kw):
    return load_spec(None, {**TINY, **kw})


# ------------------------------------------------------------------ spec
def test_the_diffusion_section_is_filled_for_diffusers_and_refused_elsewhere():
    s = _spec()
    assert s.diffusion.height == 32 and s.diffusion.steps == 2 and s.diffusion.images_per_run == 2
    assert load_spec(None, {"framework": "diffusers", "model": "sd-unet-tiny"}).diffusion.prompts
    with pytest.raises(SpecError, match="diffusion.height.*multiple of 16"):
        _spec(**{"diffusion.height": "40"})
    with pytest.raises(SpecError, match="needs framework: diffusers"):
        load_spec(None, {"model": "sd3-tiny"})
    with pytest.raises(SpecError, match="'diffusion' section needs framework: diffusers"):
        load_spec(None, {"model": "llama-tiny", "diffusion.steps": "3"})
    with pytest.raises(SpecError, match="needs a diffusion preset"):
        load_spec(None, {"framework": "diffusers", "model": "llama-tiny"})


def test_a_scheduler_of_another_family_is_bad_input():
    from inferloom.workloads.diffusers_engine import DiffusersEngine

    with pytest.raises(ConfigError, match="diffusion.scheduler: 'ddim' is not a sd3 scheduler"):
        DiffusersEngine(_spec(**{"diffusion.scheduler": "ddim"}))


# ----------------------------------------------------------------- knobs
@pytest.mark.parametrize("changes,family,guidance,match", [
    ({"attn_processor": "classic"}, "sd3", 5.0, "attn_processor.*UNet attention processor"),
    ({"compile_mode": "reduce-overhead"}, "unet", 5.0, "captures CUDA graphs"),
    ({"cfg_mode": "split"}, "unet", 1.0, "no classifier-free guidance"),
    ({"tf32_matmul": True}, "unet", 5.0, "applies only to cuda"),
    ({"sdpa_backend": "efficient"}, "unet", 5.0, "CUDA-only"),
    ({"attn_processor": "classic", "sdpa_backend": "flash"}, "unet", 5.0, "does not call SDPA"),
])
def test_knobs_that_cannot_work_are_refused_naming_the_knob(changes, family, guidance, match):
    from inferloom.workloads.diffusers_knobs import check_applicable, diffusers_knobs

    knobs = diffusers_knobs("float32", family, 2)
    with pytest.raises(AdapterError, match=match) as e:
        check_applicable(knobs, resolve_config(knobs, changes), "cpu", family, guidance > 1)
    assert e.value.kind == "unsupported"
    assert all(k.changes_numerics for k in knobs if k.name != "cpu_threads")


# --------------------------------------------------------- image contract
def test_psnr_and_ssim_of_identical_noisy_and_nonfinite_images():
    rng = np.random.default_rng(0)
    img = rng.random((16, 16, 3)).astype(np.float32)
    assert IQ.psnr_ssim(img, img) == (IQ.PSNR_IDENTICAL_DB, 1.0)
    p, s = IQ.psnr_ssim(img, np.clip(img + rng.normal(0, 0.05, img.shape), 0, 1))
    assert 20 < p < 30 and 0 < s < 0.99
    bad = img.copy()
    bad[0, 0, 0] = np.nan
    assert IQ.psnr_ssim(img, bad) == (0.0, -1.0)


def _ref(n=2, steps=3):
    g = torch.Generator().manual_seed(1)
    traj = torch.randn(n, steps, 4, 4, 4, generator=g)
    return IQ.ImageReference("eval", [[0, i] for i in range(n)], traj[:, -1].clone(), traj,
                             torch.rand(n, 16, 16, 3, generator=g))


def test_compare_images_measures_each_image_and_each_step_and_the_checks_judge():
    ref = _ref()
    same = {"latents": ref.latents, "trajectory": ref.trajectory, "images": ref.images}
    values, details = IQ.compare_images(ref, same)
    assert values["identical_images"] == 2 and values["max_latent_rel_err"] == 0 and details["step_rel_err"] == [0, 0, 0]
    th = Q.QualityThresholds()
    assert all(ok for _, ok, _, _ in IQ.image_checks(values, th))
    traj = ref.trajectory.clone()
    traj[:, 1:] *= 1.5  # diverges from step 2 on
    worse = {"latents": traj[:, -1], "trajectory": traj, "images": (ref.images * 0.5)}
    values, details = IQ.compare_images(ref, worse)
    assert details["step_rel_err"][0] == 0 and details["step_rel_err"][1] == pytest.approx(0.5)
    assert values["max_latent_rel_err"] == pytest.approx(0.5)
    assert [name for name, ok, _, _ in IQ.image_checks(values, th) if not ok] == ["min_psnr_db", "min_ssim",
                                                                                  "max_latent_rel_err"]
    nan = {**same, "latents": ref.latents * float("nan")}
    assert IQ.compare_images(ref, nan)[0]["max_latent_rel_err"] == IQ.NONFINITE_REL_ERR
    with pytest.raises(ValueError, match="images shape"):
        IQ.compare_images(ref, {**same, "images": ref.images[:1]})


# -------------------------------------------------------- costs, roofline
def test_step_costs_come_from_the_models_shape_and_the_roofline_from_them():
    c1 = diffusion_costs("sd3-tiny", 32, 32, 1, False, 4)
    c2 = diffusion_costs("sd3-tiny", 32, 32, 1, True, 4)
    assert c2["step"]["flops"] == 2 * c1["step"]["flops"] > 0  # CFG doubles the denoiser's batch
    assert c1["step"]["bytes"] == 4 * c1["denoiser_params"] and c1["decode"]["flops"] == c2["decode"]["flops"]
    from inferloom.models.diffusion_presets import build_denoiser

    n = sum(p.numel() for p in build_denoiser("sd3-medium-shaped", "meta").parameters())
    assert 1.9e9 < n < 2.2e9  # SD3 Medium's MMDiT: 2B parameters
    big = diffusion_costs("sd3-tiny", 64, 64, 1, True, 2)
    floor = 28 * max(big["step"]["bytes"] / 1e12, big["step"]["flops"] / 1e14) + max(
        big["decode"]["bytes"] / 1e12, big["decode"]["flops"] / 1e14)
    r = image_roofline({"memory_bandwidth_bytes_per_s": 1e12, "matmul_flops_per_s": 1e14}, big, 28, 0.5 / floor)
    assert r["floor_s"] == pytest.approx(floor) and r["ceiling_images_per_s"] == pytest.approx(1 / floor)
    assert r["fraction"] == pytest.approx(0.5) and r["unit"] == "images/s" and not r["suspect"]
    assert image_roofline({"memory_bandwidth_bytes_per_s": 1e12, "matmul_flops_per_s": 1e14}, big, 28,
                          10 / floor)["suspect"]


def test_the_kb_key_covers_resolution_steps_and_batch():
    s = _spec(**{"diffusion.batch_size": "2"})
    k = WorkloadKey.from_spec(s, hardware="cpu-x")
    assert k.model == "sd3-tiny@32x32/steps2/batch2" and k.framework == "diffusers"
    assert k.model_type == "sd3" and k.architecture == "SD3Transformer2DModel"
    manifest = {"spec": s.to_dict(), "adapter": {"framework": "diffusers", "device_name": "cpu-x",
                                                  "diffusers_version": k.framework_version,
                                                  "model_info": {"model_type": "sd3",
                                                                 "architecture": "SD3Transformer2DModel"}}}
    assert WorkloadKey.from_session(manifest) == k
    assert WorkloadKey.from_spec(_spec(**{"diffusion.steps": "3"}), hardware="cpu-x") != k


# ------------------------------------------------- a real tiny pipeline
@pytest.fixture(scope="module")
def engine():
    from inferloom.workloads.diffusers_breakers import BreakableEngine

    e = BreakableEngine(_spec())
    yield e
    e.close()


def test_a_run_counts_images_and_the_objective_is_images_per_second(engine):
    h = engine.prepare({})
    try:
        rec = engine.run(h, 5)
        assert rec.success, rec.error
        assert rec.output_tokens == rec.expected_output_tokens == 2 and rec.extra["unit"] == "images"
        assert engine.objective_metric(rec) == pytest.approx(2 / rec.wall_s)
        assert [b["size"] for b in rec.batches] == [1, 1]
    finally:
        engine.release(h)
    assert not engine.run(h, 5).success  # a released handle fails as data


def test_the_contract_passes_stock_and_split_cfg_and_rejects_a_dropped_block(engine):
    th = Q.QualityThresholds.from_spec(engine.spec.quality)
    items = Q.quality_prompt_sets(engine.spec, engine)["eval"]
    stock = engine.prepare({})
    ref = Q.capture_reference(engine, stock, "eval", items, 0)
    engine.release(stock)
    verdicts = {}
    for name, changes in (("stock", {}), ("split", {"cfg_mode": "split"}), ("dropped", {"breakage": "dropped_block"})):
        h = engine.prepare(resolve_config(engine.knob_space(), changes))
        try:
            verdicts[name] = Q.evaluate(engine, h, ref, th)
        finally:
            engine.release(h)
    assert verdicts["stock"].passed and verdicts["stock"].values["identical_images"] == 2
    assert verdicts["split"].passed, verdicts["split"].message
    d = verdicts["dropped"]
    assert not d.passed and d.failed_check in ("min_psnr_db", "min_ssim", "max_latent_rel_err"), d.values
    assert len(d.details["step_rel_err"]) == 2 and d.details["step_rel_err"][-1] > 0


def test_a_local_pipeline_directory_runs_and_names_its_denoiser(tmp_path):
    from inferloom.models.diffusion_presets import build_pipeline, pipeline_info
    from inferloom.workloads.diffusers_engine import DiffusersEngine

    d = tmp_path / "tiny-unet-pipeline"
    build_pipeline("sd-unet-tiny", torch.float32, "cpu", 0).save_pretrained(d)
    assert pipeline_info(str(d)) == {"model_type": "unet", "architecture": "UNet2DConditionModel"}
    e = DiffusersEngine(_spec(model=str(d), **{"diffusion.scheduler": "euler"}))
    h = e.prepare({})
    try:
        assert type(h.pipe.scheduler).__name__ == "EulerDiscreteScheduler"
        rec = e.run(h, 1)
        assert rec.success and rec.output_tokens == 2, rec.error
    finally:
        e.close()
    assert WorkloadKey.from_spec(e.spec, hardware="x").model == "tiny-unet-pipeline@32x32/steps2/batch1"
