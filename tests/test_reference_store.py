"""measure/reference_store.py: stock's quality references survive a resume, byte for byte."""

import torch

from inferloom.measure.quality import Reference
from inferloom.measure.reference_store import (FILE, decode_logprobs, encode_logprobs, load_references,
                                               save_references)
from inferloom.measure.compare import References, stock_references


def _server_like(n=3, T=4, V=5000, k=20, seed=0):
    """A server's scored log-probs: top-k per position, the rest of the mass spread uniformly."""
    g = torch.Generator().manual_seed(seed)
    t = torch.empty(n, T, V)
    for i in range(n):
        for j in range(T):
            top = torch.log_softmax(torch.randn(k, generator=g), -1) - 0.1
            rest = torch.log1p(-top.exp().sum()) - torch.log(torch.tensor(float(V - k)))
            t[i, j].fill_(float(rest))
            t[i, j, torch.randperm(V, generator=g)[:k]] = top
    return t


def test_sparse_encoding_is_lossless_and_small():
    t = _server_like()
    enc = encode_logprobs(t)
    assert "dense" not in enc and enc["vals"].numel() == 3 * 4 * 20
    assert torch.equal(decode_logprobs(enc), t)
    dense = torch.log_softmax(torch.randn(2, 3, 50), -1)  # an in-process engine's full distribution
    assert "dense" in encode_logprobs(dense) and torch.equal(decode_logprobs(encode_logprobs(dense)), dense)


def test_saved_references_come_back_only_for_the_same_stock(tmp_path):
    ref = Reference("eval", [[1, 2]], [[3, 4, 5, 6]], _server_like(1), 0.01)
    assert save_references(tmp_path / FILE, {"a": 1}, {"eval": ref})
    got = load_references(tmp_path / FILE, {"a": 1})["eval"]
    assert got.prompts == ref.prompts and got.continuations == ref.continuations and got.path_noise_nats == 0.01
    assert torch.equal(got.logprobs, ref.logprobs)
    assert load_references(tmp_path / FILE, {"a": 2}) == {}       # another stock: recaptured, not reused
    # probed otherwise (a server's prompts all in one request, before quality.concurrency): recaptured
    assert load_references(tmp_path / FILE, {"a": 1}, "quality.concurrency=1") == {}
    assert save_references(tmp_path / FILE, {"a": 1}, {"eval": ref}, "quality.concurrency=1")
    assert set(load_references(tmp_path / FILE, {"a": 1}, "quality.concurrency=1")) == {"eval"}
    assert load_references(tmp_path / FILE, {"a": 1}, "quality.concurrency=4") == {}
    assert load_references(tmp_path / "absent.pt", {"a": 1}) == {}
    (tmp_path / "damaged.pt").write_bytes(b"\x80\x04not a torch file")  # damaged: captured again, no traceback
    assert load_references(tmp_path / "damaged.pt", {"a": 1}) == {}
    big = Reference("eval", [[1]], [[2]], torch.log_softmax(torch.randn(8, 32, 8192), -1))
    assert not save_references(tmp_path / "big.pt", {"a": 1}, {"eval": big})  # dense and large: not stored


class _Counting:
    """A stand-in adapter whose greedy/score calls are counted (each a stock server's work)."""

    def __init__(self):
        self.calls = 0

    def prepare(self, cfg):
        return object()

    def release(self, h):
        pass

    def prompts(self, seed, n, length):
        return [[seed % 7 + i] * length for i in range(n)]

    def greedy(self, h, prompts, n):
        self.calls += 1
        return [[1] * n for _ in prompts]

    def score(self, h, prompts, conts):
        return _server_like(len(prompts), len(conts[0]), V=300, k=5)


def test_a_resumed_session_reads_the_references_instead_of_capturing_them(tmp_path):
    from inferloom.spec import WorkloadSpec

    spec = WorkloadSpec.model_validate({"framework": "synthetic", "device": "cpu"})
    a = _Counting()
    first = stock_references(a, spec, {"k": 1}, ["eval"], References(tmp_path / FILE), lambda m: None)
    assert a.calls == 1 and (tmp_path / FILE).is_file()
    msgs = []
    again = stock_references(a, spec, {"k": 1}, ["eval"], References(tmp_path / FILE), msgs.append)
    assert a.calls == 1 and "read from quality_refs.pt" in msgs[-1]
    assert torch.equal(again.sets["eval"].logprobs, first.sets["eval"].logprobs)
