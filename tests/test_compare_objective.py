"""compare() measures the objective the spec selects; an adapter with its own
objective (a custom workload) overrides it."""

from types import SimpleNamespace

from inferloom.measure.protocol import ProtocolSettings
from inferloom.measure.compare import compare
from inferloom.spec import load_spec
from inferloom.workloads.synthetic import SyntheticAdapter


class GoodputAdapter(SyntheticAdapter):
    """Synthetic runs that also carry a load generator's goodput (a tenth of tok/s)."""

    def run(self, handle, seed):
        rec = super().run(handle, seed)
        if rec.success:
            rec.extra["serving"] = {"request_goodput": rec.output_tokens / rec.wall_s / 10.0}
        return rec


def _cmp(adapter, objective):
    settings = ProtocolSettings.from_spec(load_spec(None, {"protocol.bootstrap_resamples": 999}).protocol)
    spec = SimpleNamespace(objective=objective)
    return compare(adapter, spec, {}, {"fast_path": True}, settings=settings, seed_base=1, refs=None,
                   progress=lambda m: None)


def test_goodput_objective_is_what_the_protocol_compares():
    tps = _cmp(GoodputAdapter(), "output_tokens_per_s").pairs
    gp = _cmp(GoodputAdapter(), "goodput").pairs
    assert len(tps) == len(gp)
    for a, b in zip(tps, gp):  # same seeds, same runs: goodput is a tenth of tok/s
        assert abs(b["value_a"] - a["value_a"] / 10.0) < 1e-6 * a["value_a"]


def test_an_adapter_objective_overrides_the_spec():
    ad = GoodputAdapter()
    ad.objective_metric = lambda rec: 42.0
    pairs = _cmp(ad, "goodput").pairs
    assert {p["value_a"] for p in pairs} == {42.0}
