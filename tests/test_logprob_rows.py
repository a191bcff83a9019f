"""`logprob_rows.topk_rows`: a server's top-k log-probabilities as a full row (the rest of the mass spread
uniformly, renormalized). The closed form gives what the dense float64 log_softmax it replaced gave (kept here
as the reference), to float32 rounding, on the cases a server returns."""

import math
import random

import pytest
import torch

from inferloom.workloads.logprob_rows import topk_rows


def dense(entry, vocab_size):
    """The former implementation: a float64 row, the fill everywhere, the known values scattered, log_softmax."""
    ids = torch.tensor([int(k) for k in entry], dtype=torch.long)
    lps = torch.nan_to_num(torch.tensor([float(v) for v in entry.values()], dtype=torch.float64), neginf=-1e4)
    mass = float(lps.exp().sum().clamp(max=1.0))
    rest = vocab_size - len(ids)
    fill = math.log(max(1.0 - mass, 1e-12) / rest) if rest > 0 else -1e4
    row = torch.full((vocab_size,), fill, dtype=torch.float64)
    if len(ids):
        row[ids] = lps
    return torch.log_softmax(row, dim=-1).float()


def _softmaxed(rng, k, vocab, temp):
    logits = [rng.gauss(0, temp) for _ in range(vocab)]
    lse = math.log(sum(math.exp(x) for x in logits))
    top = sorted(range(vocab), key=lambda i: -logits[i])[:k]
    return {i: logits[i] - lse for i in top}


@pytest.mark.parametrize("case", ["peaked", "flat", "whole-vocab", "one", "empty", "neg-inf", "mass-over-one"])
def test_the_closed_form_row_is_the_dense_log_softmax_to_float32_rounding(case):
    rng = random.Random(case)
    V = 5000 if case != "whole-vocab" else 21
    entry = {"peaked": lambda: _softmaxed(rng, 21, V, 6.0), "flat": lambda: _softmaxed(rng, 21, V, 0.1),
             "whole-vocab": lambda: _softmaxed(rng, 21, V, 2.0), "one": lambda: {7: -0.01}, "empty": dict,
             "neg-inf": lambda: {3: -0.5, 9: -math.inf, 11: -1.2},
             "mass-over-one": lambda: {1: -0.1, 2: -0.2, 3: -0.3}}[case]()
    got, want = topk_rows([[entry]], V)[0, 0], dense(entry, V)
    assert got.dtype == torch.float32 and got.shape == (V,)
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-5), (got - want).abs().max()
    assert math.isclose(float(got.double().exp().sum()), 1.0, rel_tol=1e-4)  # a distribution
    for k, v in entry.items():  # the known values keep their order and (with the rest's mass) their value
        if v > -1e3 and case not in ("mass-over-one",):
            assert math.isclose(float(got[k]), max(v, -1e4), rel_tol=1e-4, abs_tol=1e-4)


def test_a_block_of_rows_is_each_row_and_ragged_blocks_are_refused():
    rng = random.Random(3)
    entries = [[_softmaxed(rng, 5, 300, 3.0) for _ in range(4)] for _ in range(3)]
    block = topk_rows(entries, 300)
    assert block.shape == (3, 4, 300) and block.dtype == torch.float32
    for i in range(3):
        for t in range(4):
            assert torch.allclose(block[i, t], dense(entries[i][t], 300), rtol=1e-6, atol=1e-5)
    with pytest.raises(ValueError, match="same number of positions"):
        topk_rows([entries[0], entries[1][:2]], 300)


@pytest.mark.parametrize("bad", [4096, 5000, -1])
def test_a_token_id_outside_the_vocabulary_is_one_adapter_error(bad):
    # a server serving another model or tokenizer: one line naming the id, never an IndexError or (for a
    # negative id) a value silently written at the row's end
    from inferloom.workloads.base import AdapterError

    with pytest.raises(AdapterError, match=f"token id {bad} outside the model's vocabulary \\(0..4095\\)"):
        topk_rows([[{3: -0.5, bad: -1.0}]], 4096)
    assert topk_rows([[{0: -0.5, 4095: -1.0}]], 4096).shape == (1, 1, 4096)
