"""One conformance class run against every KernelBackend implementation: the
contract written in ``KernelBackend``'s docstring (inferloom/kernels/base.py).

A new backend is tested by adding a ``BackendCase`` to ``BACKENDS``;
``test_every_backend_is_registered`` fails until it is."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch
from conformance_helpers import classes_with, qualname

from inferloom.kernels import gates
from inferloom.kernels.base import KernelBackend, KernelCandidate, Target, workload_of
from inferloom.kernels.catalog_backend import CatalogBackend
from inferloom.kernels.select import NOT_KERNELS, select_targets
from inferloom.kernels.torch_backend import TorchBackend
from inferloom.spec import load_spec
from inferloom.workloads.base import resolve_config
from inferloom.workloads.registry import make_adapter
from inferloom.workloads.vllm_kernel_backend import VLLMPluginBackend
from inferloom.workloads.vllm_knobs import vllm_knobs

HAS_TRITON = importlib.util.find_spec("triton") is not None


@dataclass(frozen=True)
class BackendCase:
    """How the suite runs one backend: ``make`` builds it; ``device`` is the
    device its workload names (a workload it is available for); with
    ``runs_on_cpu`` its implementations also pass the correctness gate on this
    machine's CPU (else only their baseline and reference are run here)."""

    make: Callable[[], KernelBackend]
    device: str
    runs_on_cpu: bool
    framework: str = "transformers"  # whose knob space and stock stack the workload has


BACKENDS = [
    pytest.param(BackendCase(TorchBackend, "cpu", runs_on_cpu=True), id="torch"),
    pytest.param(BackendCase(CatalogBackend, "cuda", runs_on_cpu=False), id="catalog",
                 marks=pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")),
    pytest.param(BackendCase(VLLMPluginBackend, "cpu", runs_on_cpu=True, framework="vllm"), id="vllm_plugin"),
]
REGISTERED = {qualname(TorchBackend), qualname(CatalogBackend), qualname(VLLMPluginBackend)}

SPEC = load_spec(None, {"model": "llama-tiny", "device": "cpu", "traffic.concurrency": "3",
                        "traffic.input_len": "20", "traffic.output_len": "12"})
KNOBS = {k.name: k for k in make_adapter(SPEC).knob_space()}  # the transformers engine's
# the transformers engine's stock stack with the static cache: every kernel knob at its default,
# and the cache the attention kernels need
STACK = resolve_config(list(KNOBS.values()), {"cache_implementation": "static"})
# a vLLM server's static knob table (no server probed; the plugin knob included), at its defaults
VLLM_KNOBS = {k.name: k for k in vllm_knobs(3)}
SPACES = {"transformers": (KNOBS, STACK), "vllm": (VLLM_KNOBS, resolve_config(list(VLLM_KNOBS.values()), {}))}


@pytest.fixture(params=BACKENDS, scope="module")
def case(request) -> BackendCase:
    return request.param


@pytest.fixture
def backend(case) -> KernelBackend:
    return case.make()


@pytest.fixture
def knobs(case) -> dict[str, Any]:
    return SPACES[case.framework][0]


@pytest.fixture
def workload(case) -> dict[str, Any]:
    spec = SPEC if case.framework == "transformers" else SPEC.model_copy(update={"framework": case.framework})
    return workload_of(spec, case.device, SPACES[case.framework][1])


def _all_hot(backend: KernelBackend) -> list[Target]:
    """Every rewritable category hot, plus categories no backend may take."""
    cats = {c: {"share": 0.2} for c in sorted(backend.rewritable())}
    cats.update({"idle": {"share": 0.5}, "elementwise": {"share": 0.1}, "communication": {"share": 0.1}})
    return select_targets(cats, backend.rewritable())


def _records(cands: list[KernelCandidate]) -> list[str]:
    return [json.dumps(c.to_record(), sort_keys=True) for c in cands]


def test_every_backend_is_registered():
    found = classes_with("unavailable", "rewritable", "propose")
    assert found == REGISTERED, f"register every KernelBackend in BACKENDS: unregistered {sorted(found - REGISTERED)}"


class TestKernelBackendConformance:
    def test_is_a_kernel_backend_with_a_stable_name(self, case, backend):
        assert isinstance(backend, KernelBackend)
        assert isinstance(backend.name, str) and backend.name.strip()
        assert case.make().name == backend.name

    def test_unavailable_says_none_or_why_and_never_raises(self, backend, workload):
        assert backend.unavailable(workload) is None  # the case's own workload
        for framework in ("transformers", "vllm", "synthetic", "custom"):
            for device in ("cpu", "cuda"):
                w = {**workload, "framework": framework, "device": device}
                before = copy.deepcopy(w)
                why = backend.unavailable(w)
                assert why is None or (isinstance(why, str) and why.strip()), (framework, device, why)
                assert w == before

    def test_rewritable_is_a_stable_frozenset_of_kernel_categories(self, backend):
        cats = backend.rewritable()
        assert isinstance(cats, frozenset) and cats and all(isinstance(c, str) and c for c in cats)
        assert not cats & NOT_KERNELS
        assert backend.rewritable() == cats

    def test_nothing_picked_gives_no_candidate(self, backend, workload):
        assert backend.propose([], workload) == []
        cold = [Target(c, 0.3, False, "cold") for c in sorted(backend.rewritable())]
        assert backend.propose(cold, workload) == []
        # picked categories it cannot rewrite (select_targets never picks them; propose still ignores them)
        foreign = [Target(c, 0.3, True, "hot") for c in sorted(NOT_KERNELS | {"elementwise", "no-such-category"})
                   if c not in backend.rewritable()]
        assert backend.propose(foreign, workload) == []

    def test_proposes_only_for_picked_rewritable_targets(self, backend, workload):
        cands = backend.propose(_all_hot(backend), workload)
        assert cands, "the case's workload should give at least one candidate"
        assert all(c.target in backend.rewritable() for c in cands)
        for cat in sorted(backend.rewritable()):
            one = [Target(c, 0.3, c == cat, "hot" if c == cat else "cold") for c in sorted(backend.rewritable())]
            assert {c.target for c in backend.propose(one, workload)} <= {cat}

    def test_candidates_are_well_formed(self, backend, workload):
        cands = backend.propose(_all_hot(backend), workload)
        assert isinstance(cands, list) and all(isinstance(c, KernelCandidate) for c in cands)
        ids = [c.id for c in cands]
        assert len(set(ids)) == len(ids) and all(isinstance(i, str) and i.strip() for i in ids)
        for c in cands:
            assert isinstance(c.op, str) and c.op.strip(), c.id
            assert all(callable(f) for f in (c.implementation, c.baseline, c.reference, c.make_inputs)), c.id
            assert isinstance(c.shapes, tuple) and c.shapes, c.id
            for shape in c.shapes:
                assert shape and all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                     for k, v in shape.items()), (c.id, shape)
            assert c.dtype == workload["dtype"], c.id
            assert isinstance(c.claimed_speedup, (int, float)) and math.isfinite(c.claimed_speedup), c.id
            assert c.claimed_speedup > 0, c.id
            for k in ("rel_l2", "max_rel"):
                assert math.isfinite(float(c.tolerance[k])) and float(c.tolerance[k]) > 0, (c.id, k)
            assert isinstance(c.covers, tuple) and c.target not in c.covers, c.id
            assert all(isinstance(x, str) and x for x in c.covers), c.id
            rec = json.loads(json.dumps(c.to_record()))
            assert rec["id"] == c.id and rec["claim_status"] == "unverified"

    def test_config_changes_switch_kernel_knobs_of_the_engine(self, backend, workload, knobs):
        for c in backend.propose(_all_hot(backend), workload):
            assert c.config_changes, c.id
            for name, value in c.config_changes.items():
                assert name in knobs, f"{c.id}: {name} is not in the engine's knob space"
                assert knobs[name].phase == "KERNEL", f"{c.id}: {name} is a {knobs[name].phase} knob"
                assert knobs[name].validate(value) == value, (c.id, name, value)
            assert any(workload["stack"].get(k) != v for k, v in c.config_changes.items()), c.id

    def test_a_candidate_in_the_stack_is_not_proposed_again(self, backend, workload):
        for c in backend.propose(_all_hot(backend), workload):
            done = {**workload, "stack": {**workload["stack"], **c.config_changes}}
            assert c.id not in [x.id for x in backend.propose(_all_hot(backend), done)]

    def test_deterministic_and_leaves_its_inputs_alone(self, case, backend, workload):
        targets = _all_hot(backend)
        t0, w0 = copy.deepcopy(targets), copy.deepcopy(workload)
        first = backend.propose(targets, workload)
        assert targets == t0 and workload == w0
        assert _records(backend.propose(targets, workload)) == _records(first)
        assert _records(case.make().propose(targets, workload)) == _records(first)

    def test_calling_convention(self, case, backend, workload):
        for c in backend.propose(_all_hot(backend), workload):
            for shape in c.shapes:
                inputs, out = c.make_inputs(shape, c.dtype, "cpu", 3)
                again, _ = c.make_inputs(shape, c.dtype, "cpu", 3)
                assert isinstance(inputs, dict) and isinstance(out, torch.Tensor), c.id
                for k, v in inputs.items():  # the same seed gives the same inputs (NaN poison included)
                    if isinstance(v, torch.Tensor):
                        torch.testing.assert_close(v, again[k], rtol=0, atol=0, equal_nan=True, msg=f"{c.id}: {k}")
                    else:
                        assert v == again[k], (c.id, k)
                # the op it replaces returns the output (or several, the one compared first: vLLM's RMSNorm hands
                # on its residual too); the call the microbenchmark times, where it has one, returns the same
                for timed in (c.baseline, *([c.timed] if c.timed is not None else [])):
                    got = timed(**inputs)
                    got = got[0] if isinstance(got, tuple) else got
                    assert tuple(got.shape) == tuple(out.shape), (c.id, shape, timed)
                assert tuple(c.reference(**inputs).shape) == tuple(out.shape), (c.id, shape)
            if case.runs_on_cpu:
                res = gates.correctness(c, "cpu", seeds=(1,))
                assert res.passed, f"{c.id}: {res.why}"
