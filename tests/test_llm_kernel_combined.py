"""Two written kernels at once in the transformers engine: ``llm_kernel`` set to
the combination of the Triton RMSNorm of ``test_llm_kernel_norm.py`` and the
Triton decode attention of ``test_llm_kernel_attention.py`` (the kernels whose
gates pass there; run by the Triton interpreter, fp32) rewrites llama-tiny's
RMSNorm modules and its decode attention path together, and the model decodes
as stock does: the same greedy tokens, its log-probabilities within 1e-4."""

import hashlib
import importlib.util

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from test_llm_kernel_attention import TRITON_DECODE  # noqa: E402  (imports triton for the interpreter)
from test_llm_kernel_norm import TRITON_RMSNORM  # noqa: E402

from inferloom.kernels import written  # noqa: E402
from inferloom.kernels import written_set  # noqa: E402
from inferloom.workloads import engine_written  # noqa: E402


def test_a_combination_of_a_written_rmsnorm_and_decode_attention_decodes_llama_tiny_like_stock(tmp_path, monkeypatch):
    from inferloom.spec import load_spec
    from inferloom.workloads.transformers_engine import TransformersEngine

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(written, "_REGISTRY", {})
    monkeypatch.setattr(written, "COMBINED", {})
    kdir = tmp_path / "llm" / "kernels"
    kdir.mkdir(parents=True)
    names = []
    for entry, src in (("decode_attention", TRITON_DECODE), ("add_rmsnorm", TRITON_RMSNORM)):
        name = written.kernel_name(entry, hashlib.sha256(src.encode()).hexdigest())
        (kdir / f"{name}.py").write_text(src)
        written.register(tmp_path, name, entry, kdir / f"{name}.py")
        names.append(name)
    attn, norm = names
    combo = written_set.compose(names)
    assert combo == f"{norm}+{attn}"
    written_set.register_combined(tmp_path, combo)
    calls = []
    real = engine_written._decode
    monkeypatch.setattr(engine_written, "_decode", lambda fn: (lambda *a: calls.append(1) or real(fn)(*a)))
    spec = load_spec(None, {"model": "llama-tiny", "device": "cpu", "traffic.concurrency": 4, "traffic.input_len": 16,
                            "traffic.output_len": 8, "traffic.num_prompts": 4, "agents.llm.provider": "openai",
                            "agents.llm.model": "m", "agents.llm.api_key_env": "K", "agents.llm.roles": "kernel_author"})
    eng = TransformersEngine(spec)
    assert combo in next(k for k in eng.knob_space() if k.name == "llm_kernel").choices
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [3, 3]]  # ragged: left padding
    outs = {}
    for key, cfg in (("stock", {"cache_implementation": "static"}),
                     ("written", {"cache_implementation": "static", "llm_kernel": combo})):
        h = eng.prepare(cfg)
        try:
            outs[key] = eng.greedy_logprobs(h, prompts, 5)
            if key == "written":
                note = h.notes["llm_kernel"]
                assert note.startswith(f"{norm}: 9 RMSNorm modules call the written add_rmsnorm kernel ({norm}.py); "
                                       f"{attn}: decode steps of 4 attention modules call the written "
                                       f"decode_attention kernel ({attn}.py)"), note
        finally:
            eng.release(h)
    assert outs["written"][0] == outs["stock"][0]
    lp_w, lp_s = outs["written"][1], outs["stock"][1]
    assert (lp_w - lp_s).abs().max() <= 1e-4 * lp_s.abs().max()
    assert len(calls) == 4 * 4  # llama-tiny's 4 layers x 4 decode steps through the written attention
