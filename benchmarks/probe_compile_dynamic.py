"""Probe (2026-12-01, issue 15 part (b)): does compile_mode=default run on llama-tiny with the dynamic
and with the static cache, on the CPU and on CUDA? On the H200 host (torch 2.11.0+cu130) the dynamic-cache
compile failed on the CPU in every configuration of the measured table; this prints the engine's error.

    OMP_NUM_THREADS=4 PYTHONPATH=src python3 benchmarks/probe_compile_dynamic.py
"""
import sys, time, traceback
sys.path.insert(0, "benchmarks")
import search_efficiency_real as r
for dev in ("cpu", "cuda"):
    spec = {**r.SPEC, "device": dev, "traffic.num_prompts": 8, "traffic.output_len": 32}
    try:
        ad = r._adapter(spec)
        for cfg in ({"compile_mode": "default"}, {"compile_mode": "default", "cache_implementation": "static"}):
            t0 = time.time(); h = ad.prepare(cfg); rec = ad.run(h, 1); rec2 = ad.run(h, 2)
            print(dev, cfg, "success", rec.success, rec2.success, f"{time.time()-t0:.0f} s")
            print("ERROR:", (rec.error or "")[:3000]); print("ERROR2:", (rec2.error or "")[:1500], flush=True)
            ad.release(h)
        ad.close()
    except Exception:
        traceback.print_exc()
