"""How far benign changes move the quality metrics on llama-tiny (CPU): the
runs the default thresholds in docs/quality.md were set from.

Stock (fp32) against candidates that compute the same function (eager
attention, static cache) and against reduced precision (bf16, fp16), on 16
eval prompts, printing every metric at several tie margins.

    .venv/bin/python benchmarks/quality_calibration.py
"""

from inferloom.measure import quality as Q
from inferloom.spec import load_spec
from inferloom.workloads.transformers_engine import TransformersEngine

spec = load_spec("examples/llama-tiny.yaml", {"quality.eval_prompts": 16})
eng = TransformersEngine(spec)
stock = eng.prepare({})
ref = Q.capture_reference(eng, stock, "eval", Q.quality_prompt_sets(spec, eng)["eval"], 32)
lp = ref.logprobs
top2 = lp.topk(2, -1).values
gap = (top2[..., 0] - top2[..., 1]).flatten()
print(f"stock: top1-top2 gap median {gap.median():.3f} nats, p10 {gap.quantile(0.1):.3f}; "
      f"median top-1 probability {lp.max(-1).values.exp().median():.3f}; path noise {ref.path_noise_nats:.2e} nats")
for cand in ({"attn_implementation": "eager"}, {"cache_implementation": "static"},
             {"dtype": "bfloat16"}, {"dtype": "float16"}):
    h = eng.prepare(cand)
    conts = eng.greedy(h, ref.prompts, 32)
    clp = eng.score(h, ref.prompts, ref.continuations)
    for margin in (0.0, 0.1):
        v = {**Q.teacher_forced_agreement(lp, clp, margin), **Q.greedy_agreement(ref.continuations, conts, lp, margin)}
        print(cand, f"tie margin {margin}:", {k: round(x, 5) for k, x in v.items()})
    eng.release(h)
eng.close()
