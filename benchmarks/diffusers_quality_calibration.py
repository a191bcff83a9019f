"""Calibrate the image quality contract (docs/quality.md, "Images").

For one diffusers workload, generate the eval set's images with stock, then
judge against them: stock itself (a second, fresh pipeline), legitimate
numerics changes (other dtypes, fused QKV, forced SDPA kernels, split CFG,
channels_last) and deliberately broken candidates
(:mod:`inferloom.workloads.diffusers_breakers`: wrong timesteps, a dropped
block, int4 and int8 weight noise). Prints one markdown table row per
candidate (min PSNR, min SSIM, max final-latent and per-step relative error,
and the verdict under the spec's thresholds) and exits 1 when stock fails
against itself or a must-fail breakage passes.

CPU (the tiny presets; about a minute each):

    PYTHONPATH=src python benchmarks/diffusers_quality_calibration.py --model sd3-tiny --size 64 --steps 4
    PYTHONPATH=src python benchmarks/diffusers_quality_calibration.py --model sd-unet-tiny --size 64 --steps 4

H200 (the SD3-Medium-shaped MMDiT at 1024x1024, 28 steps, bf16; about 3 minutes):

    PYTHONPATH=src python benchmarks/diffusers_quality_calibration.py --model sd3-medium-shaped \\
        --device cuda --dtype bfloat16 --size 1024 --steps 28 --images 4 --json $OUT/calibration.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from inferloom.measure import quality as Q
from inferloom.spec import load_spec
from inferloom.workloads.base import AdapterError, resolve_config
from inferloom.workloads.diffusers_breakers import BREAKERS, MUST_FAIL, BreakableEngine


def candidates(device: str, dtype: str, family: str) -> list[tuple[str, dict[str, object], str]]:
    """(name, changes, kind) with kind stock / legit / broken."""
    out: list[tuple[str, dict[str, object], str]] = [("stock (fresh pipeline)", {}, "stock")]
    for dt in ("float32", "bfloat16", "float16"):
        if dt != dtype and not (device == "cpu" and dt == "float16"):
            out.append((f"dtype={dt}", {"dtype": dt}, "legit"))
    out += [("fuse_qkv", {"fuse_qkv": True}, "legit"), ("cfg_mode=split", {"cfg_mode": "split"}, "legit"),
            ("sdpa_backend=math", {"sdpa_backend": "math"}, "legit"),
            ("channels_last", {"channels_last": True}, "legit")]
    if device == "cuda":
        out.append(("sdpa_backend=flash" if dtype != "float32" else "tf32", {"sdpa_backend": "flash"} if dtype !=
                    "float32" else {"tf32_matmul": True}, "legit"))
    if family == "unet":
        out.append(("attn_processor=classic", {"attn_processor": "classic"}, "legit"))
    out += [(f"breakage={b}", {"breakage": b}, "broken" if b in MUST_FAIL else "mild") for b in BREAKERS]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="sd3-tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--guidance", type=float, default=5.0)
    ap.add_argument("--images", type=int, default=4, help="eval images")
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args()
    spec = load_spec(None, {"framework": "diffusers", "model": a.model, "device": a.device, "dtype": a.dtype,
                            "diffusion.height": a.size, "diffusion.width": a.size, "diffusion.steps": a.steps,
                            "diffusion.guidance_scale": a.guidance, "quality.eval_prompts": a.images})
    eng = BreakableEngine(spec)
    th = Q.QualityThresholds.from_spec(spec.quality)
    items = Q.quality_prompt_sets(spec, eng)["eval"]
    t0 = time.perf_counter()
    h = eng.prepare(resolve_config(eng.knob_space(), {}))
    ref = Q.capture_reference(eng, h, "eval", items, 0)
    eng.release(h)
    print(f"# {a.model} {a.size}x{a.size}, {a.steps} steps, guidance {a.guidance}, {a.dtype} on {a.device}; "
          f"{len(items)} eval images; thresholds: PSNR >= {th.min_psnr_db} dB, SSIM >= {th.min_ssim}, "
          f"final-latent rel. error <= {th.max_latent_rel_err} (stock captured in {time.perf_counter() - t0:.1f}s)")
    print("| candidate | kind | min PSNR (dB) | min SSIM | max latent rel. err | max step rel. err | verdict |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    rows, bad = [], []
    for name, changes, kind in candidates(a.device, a.dtype, eng.family):
        try:
            h = eng.prepare(resolve_config(eng.knob_space(), changes))
        except AdapterError as exc:
            print(f"| {name} | {kind} | - | - | - | - | not applicable: {exc} |")
            continue
        try:
            v = Q.evaluate(eng, h, ref, th)
        except RuntimeError as exc:  # e.g. a fused SDPA kernel that can't take the VAE's 512-dim heads
            msg = str(exc).strip().splitlines()[-1][:160] if str(exc).strip() else type(exc).__name__
            print(f"| {name} | {kind} | - | - | - | - | failed to run: {msg} |", flush=True)
            rows.append({"candidate": name, "kind": kind, "error": msg})
            continue
        finally:
            eng.release(h)
        x = v.values
        verdict = "pass" if v.passed else f"FAIL ({v.failed_check})"
        print(f"| {name} | {kind} | {x['min_psnr_db']:.1f} | {x['min_ssim']:.4f} | {x['max_latent_rel_err']:.3g} | "
              f"{x['max_step_rel_err']:.3g} | {verdict} |", flush=True)
        rows.append({"candidate": name, "kind": kind, "values": x, "passed": v.passed, "failed_check": v.failed_check})
        if (kind == "stock" and not v.passed) or (kind == "broken" and v.passed):
            bad.append(name)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"args": vars(a), "thresholds": th.__dict__, "rows": rows}, f, indent=1)
    if bad:
        print(f"calibration FAILED: {', '.join(bad)} landed on the wrong side of the thresholds", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
