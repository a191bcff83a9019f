"""Where does the stock gap come from? Times, in one process on one model,
inferloom's engine.run() against a plain model.generate() on the same prompts
(the way FACTS.md's ~2,800 tok/s was measured). Run on the H200:
    PYTHONPATH=src python3 benchmarks/gpu_stock_gap.py
"""
import statistics
import time

import torch

from inferloom.spec import load_spec
from inferloom.workloads.transformers_engine import TransformersEngine

spec = load_spec("examples/llama-3.1-8b-h200.yaml")
eng = TransformersEngine(spec)
h = eng.prepare({})
t = spec.traffic
ids, mask = eng._batch_tensors(eng.prompts(5, t.concurrency))
tok = t.concurrency * t.output_len


def plain(mode):
    ctx = torch.inference_mode() if mode == "inference_mode" else torch.no_grad()
    with ctx:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        h.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=t.output_len,
                         min_new_tokens=t.output_len, do_sample=False)
        torch.cuda.synchronize()
        return tok / (time.perf_counter() - t0)


rows = {"engine.run": [], "plain no_grad": [], "plain inference_mode": []}
eng.run(h, 1)
for i in range(4):
    r = eng.run(h, 100 + i)
    rows["engine.run"].append(r.output_tokens / r.wall_s)
    rows["plain no_grad"].append(plain("no_grad"))
    rows["plain inference_mode"].append(plain("inference_mode"))
for k, v in rows.items():
    print(f"{k:22s} median {statistics.median(v):8.1f} tok/s  runs {[round(x) for x in v]}")
