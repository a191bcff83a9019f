"""The kernel catalog on the GPU: each entry's correctness and its speed
against the op it replaces, at the llama-3.1-8b decode shape.

Shape: batch 64, 320 tokens of context in a 384-slot static cache, bfloat16
(the issue-7 workload, 256 in / 128 out, half-way through decode).

For every entry (``inferloom.kernels.catalog.index.entries()``):

1. correctness: fresh random inputs per seed, outputs poisoned with NaN,
   relative error against the float64 reference under the declared tolerance
   (decode attention also at ragged and left-padded lengths, length 1 and
   length = cache size; the cache outside each row's range is NaN, so reading
   the padding fails);
2. autotune (unless ``--no-tune``): each config of the entry's tune space,
   checked then timed; the winner cached per device name under
   ``$INFERLOOM_KERNEL_CACHE`` (default ``<out>/kernel_cache``);
3. microbenchmark against the op it replaces (HF's eager / SDPA path; for
   attention also SDPA with ``enable_gqa``): CUDA events, warm-up excluded,
   median of ``--runs`` (>= 50), inputs rotating over sets larger than 3× L2,
   host launch overhead hidden (GPU time, as under CUDA-graph replay);
4. CUDA-graph capture: one call captured, output poisoned, replayed: the
   replay must write the same values as the eager call;
5. (``--no-hf`` skips it) decode attention inside HF's model: a 2-layer model
   of the 8B shape, eager, static cache, left-padded batch of 64, 16 new
   tokens, the engine's ``attention_kernel=triton_decode`` against ``"sdpa"``:
   the first decode step's logits (same prefix) and generate() wall times
   (informational; eager, so host overhead dominates).

Prints a table and writes ``$OUT/kernels.json`` (``runs/kernels-<time>.json``
when ``$OUT`` is unset). Needs only torch, triton and numpy. Run on the H200:

    python3 benchmarks/gpu_kernels.py

Smoke test on a CPU (Triton interpreter, tiny shapes, float16, no tuning; the
timings mean nothing there):

    python3 benchmarks/gpu_kernels.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# per decode step of the 8B model (32 layers): how often each op runs
CALLS_PER_STEP = {"decode_attention": 32, "add_rmsnorm": 65, "gate_up_silu": 32, "silu_mul": 32,
                  "qkv_proj": 32, "fp8_linear": 32}
COPY_CEILING_TBS = 4.11  # FACTS.md: device-to-device copy, H200


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, tiny shapes")
    ap.add_argument("--no-tune", action="store_true", help="skip the autotune (use cached / default configs)")
    ap.add_argument("--no-hf", action="store_true", help="skip the check inside a 2-layer HF model")
    ap.add_argument("--runs", type=int, default=60, help="timed runs per op (median reported)")
    ap.add_argument("--entries", default="", help="comma-separated entry names (default: all)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=320)
    ap.add_argument("--cache-len", type=int, default=384)
    ap.add_argument("--budget-s", type=float, default=150.0,
                    help="stop tuning (not checking or timing) once this much wall time is spent")
    ap.add_argument("--out", default="", help="output JSON (default $OUT/kernels.json or runs/)")
    return ap.parse_args(argv)


def _min_bytes(name: str, shape: dict, elt: int) -> int:
    """Bytes the op must move at least (reads + writes), for an achieved-bandwidth column."""
    s = shape
    if name == "decode_attention":
        return 2 * s["batch"] * s["kv_heads"] * s["context"] * s["head_dim"] * elt + \
            2 * s["batch"] * s["q_heads"] * s["head_dim"] * elt
    if name == "add_rmsnorm":
        return 4 * s["tokens"] * s["hidden"] * elt + s["hidden"] * elt
    if name == "gate_up_silu":
        return (2 * s["intermediate"] * s["hidden"] + s["tokens"] * s["hidden"] + s["tokens"] * s["intermediate"]) * elt
    if name == "silu_mul":
        return 3 * s["tokens"] * s["intermediate"] * elt
    if name == "qkv_proj":
        n = (s["q_heads"] + 2 * s["kv_heads"]) * s["head_dim"]
        return (n * s["hidden"] + s["tokens"] * (s["hidden"] + n)) * elt
    if name == "fp8_linear":
        return s["out_features"] * s["in_features"] + (s["tokens"] * (s["in_features"] + s["out_features"])) * elt
    return 0


def _check_cases(name: str, shape: dict) -> list[tuple[str, dict, int]]:
    cases = [("seed0", dict(shape), 0), ("seed1", dict(shape), 1)]
    if name == "decode_attention":
        base = {k: v for k, v in shape.items() if k != "context"}
        cases += [("ragged", {**base, "ragged": 1}, 2), ("ragged+leftpad", {**base, "ragged": 1, "left_pad": 1}, 3),
                  ("len1", {**base, "context": 1}, 4), ("full", {**base, "context": shape["max_len"]}, 5)]
    return cases


def _graph_replay_ok(entry, shape, dtype, device, config) -> dict:
    """Capture one call in a CUDA graph (as reduce-overhead would), poison the
    output, replay: the replay must write the same bits as the eager call."""
    import torch

    from inferloom.kernels.catalog.entry import as_tuple, poison

    inputs, out = entry.make_inputs(shape, dtype, device, 77)
    kw = {"config": config} if config else {}
    entry.implementation(**inputs, out=out, **kw)  # compile + tuning lookup outside the capture
    torch.cuda.synchronize()
    want = [t.clone() for t in as_tuple(out)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        entry.implementation(**inputs, out=out, **kw)
    poison(out)
    graph.replay()
    torch.cuda.synchronize()
    same = all(torch.equal(a, b) for a, b in zip(as_tuple(out), want))
    return {"graph_replay_equal": same}


def _hf_integration(device: str, fields: dict, dtype, layers: int = 2, batch: int = 64, prompt: int = 256,
                    new: int = 16) -> dict:
    """The kernel inside HF's model (the engine's ``attention_kernel=triton_decode``) on a
    ``layers``-layer model of the 8B shape, eager, static cache, left-padded batch:
    decode-step logits against SDPA's, and the generate() wall times."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from inferloom.workloads import engine_attention as attention

    name = attention.register("triton_decode")
    fields = {k: v for k, v in fields.items() if k != "architecture"}
    cfg = LlamaConfig(**{**fields, "num_hidden_layers": layers, "pad_token_id": 0, "bos_token_id": 1,
                         "eos_token_id": 2})
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    g = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(3, min(30000, cfg.vocab_size), (batch, prompt), generator=g, device=device)
    pads = (torch.arange(batch, device=device) % 17 * 3).clamp(max=prompt - 1)  # left padding, 0..48 tokens
    keep = torch.arange(prompt, device=device)[None, :] >= pads[:, None]
    ids = torch.where(keep, ids, 0)
    out = {}
    for impl in ("sdpa", name):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=keep.long(), max_new_tokens=2, do_sample=False,
                           cache_implementation="static")  # warm-up
            sync()
            t0 = time.perf_counter()
            r = model.generate(input_ids=ids, attention_mask=keep.long(), max_new_tokens=new, min_new_tokens=new,
                               do_sample=False, cache_implementation="static", output_logits=True,
                               return_dict_in_generate=True)
            sync()
            out[impl] = (r, time.perf_counter() - t0)
    (a, ta), (b, tb) = out["sdpa"], out[name]
    la, lb = a.logits[1].double(), b.logits[1].double()  # step 1: the first decode step (same prefix)
    rel = float((la - lb).norm() / la.norm())
    return {"passed": rel < (2e-2 if dtype == torch.bfloat16 else 1e-4), "layers": layers, "batch": batch, "prompt": prompt, "new_tokens": new,
            "step1_logits_rel_l2": rel,
            "tokens_equal_fraction": float((a.sequences == b.sequences).double().mean()),
            "generate_s_sdpa": round(ta, 3), "generate_s_kernel": round(tb, 3)}


def main(argv=None) -> int:
    args = _args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    sys.path.insert(0, str(ROOT / "src"))
    out_path = Path(args.out) if args.out else (
        Path(os.environ["OUT"]) / "kernels.json" if os.environ.get("OUT")
        else ROOT / "runs" / f"kernels-{time.strftime('%Y%m%d-%H%M%S')}.json")
    os.environ.setdefault("INFERLOOM_KERNEL_CACHE", str(out_path.parent / "kernel_cache"))

    import torch
    import triton

    from inferloom.kernels import catalog
    from inferloom.kernels.catalog import bench, index, tuning
    from inferloom.kernels.catalog.entry import check
    from inferloom.models.presets import PRESETS

    t_start = time.perf_counter()
    if args.smoke:
        device, dtype = "cpu", "float16"
        model = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                 "intermediate_size": 96}
        batch, context, cache_len = 4, 40, 48
        args.runs, args.no_tune = 3, True
    else:
        if not torch.cuda.is_available():
            print("no CUDA device (use --smoke on a CPU)", file=sys.stderr)
            return 2
        device, dtype = "cuda", "bfloat16"
        model = PRESETS["llama-3.1-8b"]
        batch, context, cache_len = args.batch, args.context, args.cache_len
    shapes = catalog.workload_shapes(model, batch, context, cache_len)
    wanted = {e for e in args.entries.split(",") if e}
    elt = {"bfloat16": 2, "float16": 2, "float32": 4}[dtype]

    report = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": tuning.device_name(device), "torch": torch.__version__, "triton": triton.__version__,
        "dtype": dtype, "model": "tiny (smoke)" if args.smoke else "llama-3.1-8b",
        "batch": batch, "context": context, "cache_len": cache_len, "runs": args.runs,
        "l2_bytes": bench.l2_bytes(device), "tuning_cache": str(tuning.cache_path(device)), "entries": [],
    }
    for entry in index.entries():
        if wanted and entry.name not in wanted:
            continue
        shape = shapes[entry.name]
        row: dict = {"name": entry.name, "target_op": entry.target_op, "shape": shape,
                     "tolerance": dict(entry.tolerance(dtype)) if dtype in entry.tolerances else None}
        report["entries"].append(row)
        why = entry.unsupported(dtype, device)
        if why:
            row["skipped"] = why
            print(f"[skip] {why}", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            row["checks"] = []
            for label, s, seed in _check_cases(entry.name, shape):
                r = check(entry, s, dtype, device, seed)
                row["checks"].append({"case": label, **r.to_dict()})
            config = None
            if not args.no_tune and entry.tune_space:
                if time.perf_counter() - t_start > args.budget_s:
                    row["tune"] = "skipped: over --budget-s"
                else:
                    config, rows = bench.autotune_entry(entry, shape, dtype, device)
                    row["tune"] = rows
                    r = check(entry, shape, dtype, device, 9, config=config)
                    row["checks"].append({"case": "tuned-config", **r.to_dict()})
            cfg_used = config or tuning.lookup(entry.name, dtype, entry.tune_key(shape), device, entry.default_config)
            row["config"] = dict(cfg_used)
            sets = bench.input_sets(entry, bench._bench_shape(shape), dtype, device, 1000)
            res = bench.bench_entry(entry, shape, dtype, device, runs=args.runs, config=cfg_used or None, sets=sets)
            row.update(res)
            if entry.name == "decode_attention":
                from inferloom.kernels.catalog.decode_attention import sdpa_gqa_baseline

                ts = bench.time_calls([lambda i=i: sdpa_gqa_baseline(**i) for i, _ in sets], device, args.runs)
                row["sdpa_gqa_us"] = sorted(ts)[len(ts) // 2]
            del sets
            if device == "cuda":
                row.update(_graph_replay_ok(entry, shape, dtype, device, cfg_used))
            row["passed"] = all(c["passed"] for c in row["checks"]) and row.get("graph_replay_equal", True)
            nbytes = _min_bytes(entry.name, shape, elt)
            row["min_bytes"] = nbytes
            row["impl_tbs"] = nbytes / (row["impl_us"] * 1e-6) / 1e12
            row["calls_per_step"] = CALLS_PER_STEP.get(entry.name, 0)
            row["saved_ms_per_step"] = (row["baseline_us"] - row["impl_us"]) * row["calls_per_step"] / 1e3
        except Exception as exc:  # record and go on: one entry must not cost the others' device time
            row["error"] = f"{type(exc).__name__}: {exc}"
            row["traceback"] = traceback.format_exc()[-2000:]
            print(f"[error] {entry.name}: {row['error']}", flush=True)
        row["seconds"] = round(time.perf_counter() - t0, 1)
        if device == "cuda":
            torch.cuda.empty_cache()
    import importlib.util

    if not args.no_hf and (not wanted or "decode_attention" in wanted) and importlib.util.find_spec("transformers") is None:
        report["hf_integration"] = {"skipped": "transformers is not installed", "passed": True}
    elif not args.no_hf and (not wanted or "decode_attention" in wanted):
        try:
            if args.smoke:
                tiny = {**model, "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 256}
                report["hf_integration"] = _hf_integration(device, tiny, torch.float32, 2, 4, 12, 4)
            else:
                report["hf_integration"] = _hf_integration(device, PRESETS["llama-3.1-8b"], torch.bfloat16)
            print(f"[hf] {report['hf_integration']}", flush=True)
        except Exception as exc:
            report["hf_integration"] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
            print(f"[hf] error: {report['hf_integration']['error']}", flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    report["seconds"] = round(time.perf_counter() - t_start, 1)

    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=1, default=str))
    _print_table(report)
    print(f"\nwrote {out_path} ({report['seconds']} s)")
    bad = [r["name"] for r in report["entries"] if r.get("error") or r.get("passed") is False]
    if "hf_integration" in report and not report["hf_integration"].get("passed"):
        bad.append("hf_integration")
    if bad:
        print(f"FAILED: {', '.join(bad)}")
    return 1 if bad else 0


def _print_table(report: dict) -> None:
    print(f"\n{report['device']}  torch {report['torch']}  triton {report['triton']}  {report['dtype']}  "
          f"{report['model']}  batch {report['batch']}  context {report['context']}/{report['cache_len']}")
    hdr = f"{'entry':18s} {'ok':4s} {'worst rel_l2':>12s} {'impl µs':>9s} {'base µs':>9s} {'speedup':>8s} " \
          f"{'TB/s':>6s} {'saved ms/step':>13s}  config"
    print(hdr)
    print("-" * len(hdr))
    for r in report["entries"]:
        if "skipped" in r or "error" in r:
            print(f"{r['name']:18s} {'skip' if 'skipped' in r else 'ERR':4s}  {r.get('skipped') or r.get('error')}")
            continue
        worst = max(c["rel_l2"] for c in r["checks"])
        extra = f"  (sdpa enable_gqa {r['sdpa_gqa_us']:.1f} µs)" if "sdpa_gqa_us" in r else ""
        print(f"{r['name']:18s} {'yes' if r['passed'] else 'NO':4s} {worst:12.2e} {r['impl_us']:9.1f} "
              f"{r['baseline_us']:9.1f} {r['speedup']:7.2f}x {r['impl_tbs']:6.2f} {r['saved_ms_per_step']:13.3f}  "
              f"{r['config']}{extra}")
        if r.get("graph_replay_equal") is False:
            print(f"{'':18s} CUDA-graph replay wrote different values than the eager call")
        for c in r["checks"]:
            if not c["passed"]:
                print(f"{'':18s} check {c['case']}: {c['rule']} {c['detail']}")


if __name__ == "__main__":
    sys.exit(main())
