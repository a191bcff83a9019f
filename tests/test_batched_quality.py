"""The batched guard (measure/batched_quality.py): the contract's probes send each prompt alone, and a
server's batched paths are judged for gross damage only: batch-composition noise at the level measured on
an H200 passes, a broken batched computation fails, and an adapter without the hook is left as it was."""

from __future__ import annotations

import torch

from inferloom.measure import quality as Q
from inferloom.measure.batched_quality import LIMITS, batched_guard, judge_batched
from inferloom.workloads.quality_hooks import BatchedProbes

N, T, V = 8, 32, 2048


def _stock():
    logits = 3.0 * torch.randn(N, T, V, generator=torch.Generator().manual_seed(0))  # a random-weights model
    lp = torch.log_softmax(logits.double(), -1)
    return logits, Q.Reference("eval", [[1, 2, 3]] * N, lp.argmax(-1).tolist(), lp.float())


class _Server:
    """Stand-in for a server's batched path: ``logits`` are what its one-request batch computes."""

    def __init__(self, logits):
        self.lp = torch.log_softmax(logits.double(), -1).float()
        self.calls = []

    def score_batched(self, handle, prompts, continuations):
        self.calls.append(("score", len(prompts)))
        return self.lp

    def greedy_batched(self, handle, prompts, max_new_tokens):
        self.calls.append(("greedy", len(prompts)))
        return self.lp.argmax(-1)[:, :max_new_tokens].tolist()


def _passed():
    return Q.judge("eval", {"top1_agreement": 1.0, "mean_kl": 0.0, "greedy_agreement": 1.0}, Q.QualityThresholds(),
                   N, N * T)


def _noise(std, seed):
    return std * torch.randn(N, T, V, generator=torch.Generator().manual_seed(seed))


def test_batch_composition_noise_passes_the_guard_and_is_recorded():
    logits, ref = _stock()
    server = _Server(logits + _noise(0.15, 1))  # the noise level of an H200 A/A (top-1 ~0.95: fails 0.98)
    assert isinstance(server, BatchedProbes)
    v = batched_guard(server, None, ref, _passed(), 0.1)
    b = v.details["batched"]
    assert v.passed and b["passed"] and server.calls == [("score", N), ("greedy", N)]
    assert 0.85 <= b["values"]["top1_agreement"] < 0.98 and b["values"]["mean_kl"] < 0.25
    assert b["limits"]["top1_agreement"] == [">=", 0.85]


def test_a_broken_batched_path_fails_the_verdict_naming_the_batched_check():
    logits, ref = _stock()
    garbage = 3.0 * torch.randn(N, T, V, generator=torch.Generator().manual_seed(7))
    v = batched_guard(_Server(garbage), None, ref, _passed(), 0.1)
    assert not v.passed and v.failed_check == "batched_top1_agreement"
    assert v.message.startswith("eval: batched top1_agreement = ") and "gross damage" in v.message
    assert not v.details["batched"]["passed"]


def test_a_verdict_that_failed_keeps_its_own_reason_and_an_adapter_without_the_hook_is_unchanged():
    logits, ref = _stock()
    failed = Q.judge("eval", {"top1_agreement": 0.5, "mean_kl": 0.0, "greedy_agreement": 1.0},
                     Q.QualityThresholds(), N, N * T)
    garbage = 3.0 * torch.randn(N, T, V, generator=torch.Generator().manual_seed(8))
    v = batched_guard(_Server(garbage), None, ref, failed, 0.1)
    assert v.failed_check == "top1_agreement" and not v.details["batched"]["passed"]
    plain = batched_guard(object(), None, ref, _passed(), 0.1)
    assert plain.passed and "batched" not in plain.details


def test_judge_batched_checks_each_limit():
    ok = {"top1_agreement": 0.9, "mean_kl": 0.1, "greedy_agreement": 0.5}
    assert judge_batched(ok) == (None, None)
    for check, bad in (("top1_agreement", 0.84), ("mean_kl", 0.26), ("greedy_agreement", 0.39)):
        failed, msg = judge_batched({**ok, check: bad})
        assert failed == f"batched_{check}" and LIMITS[check][0] in msg
