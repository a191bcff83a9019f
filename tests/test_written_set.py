"""A value of ``llm_kernel`` that names several written kernels
(``kernels/written_set.py``): written kernels of different modules sorted and
joined by ``+``; the candidate of a kernel whose gates passed is the stack's
written kernels plus it (one that rewrites the same modules replaced); the
conflict checks apply to every member; the diffusers engine refuses any member
that isn't an ``add_rmsnorm`` one; a resumed session registers the combinations
it registered, and ``verify --remeasure``'s ``restore_checked`` checks every
member's source, refusing a missing or changed one by its name. A single
kernel's value reads as before. No Triton here: the kernels are torch modules
on files, registered as the KERNEL phase registers them."""

import hashlib
import json
import re

import pytest

from inferloom.kernels import written
from inferloom.kernels import written_set as W
from inferloom.workloads.base import AdapterError
from inferloom.workloads.diffusers_ops import written_rule
from inferloom.workloads import engine_written as E
from inferloom.workloads.transformers_knobs import check_applicable
from test_llm_kernel import _engine_knobs

NORM, ATTN, GATE, SILU = "add_rmsnorm-0123456789", "decode_attention-abcdef0123", "gate_up_silu-1111111111", \
    "silu_mul-2222222222"
SIGNATURES = {"add_rmsnorm": "x, residual, weight, eps=1e-5", "gate_up_silu": "x, w_gate_up", "silu_mul": "gu",
              "decode_attention": "q, k_cache, v_cache, seq_lens, starts=None, scale=None"}
SOURCES = {e: f"def kernel({sig}, *, out):\n    pass\n" for e, sig in SIGNATURES.items()}


@pytest.fixture
def fresh(monkeypatch):
    """A process with no written kernel registered."""
    monkeypatch.setattr(written, "_REGISTRY", {})
    monkeypatch.setattr(written, "COMBINED", {})


def _kernels(d, *entries):
    """Write and register (as the KERNEL phase does after the gates) one kernel per entry; their values."""
    kdir = d / "llm" / "kernels"
    kdir.mkdir(parents=True, exist_ok=True)
    out = []
    for e in entries:
        src = SOURCES[e]
        name = written.kernel_name(e, hashlib.sha256(src.encode()).hexdigest())
        (kdir / f"{name}.py").write_text(src)
        written.register(d, name, e, kdir / f"{name}.py")
        out.append(name)
    return out


def test_a_combined_value_is_its_members_sorted_and_joined_by_plus():
    assert W.members("none") == () and W.members(NORM) == (NORM,)
    assert W.members(f"{ATTN}+{NORM}") == (ATTN, NORM)
    assert W.compose([GATE, NORM]) == W.compose([NORM, GATE]) == f"{NORM}+{GATE}"  # one spelling per set
    assert W.compose([f"{NORM}+{GATE}", ATTN]) == f"{NORM}+{ATTN}+{GATE}" and W.compose(["none"]) == "none"
    assert W.compose([NORM]) == NORM  # a single kernel's value as before
    with pytest.raises(ValueError, match=f"{GATE} and {SILU} both rewrite the MLP"):
        W.compose([SILU, GATE])
    assert W.overlap(f"{NORM}+{GATE}") is None
    assert "not in the canonical order" in W.overlap(f"{GATE}+{NORM}")
    assert "both rewrite the RMSNorms" in W.overlap(f"{NORM}+add_rmsnorm-9999999999")


def test_a_new_kernel_joins_the_stacks_and_replaces_the_one_of_the_same_modules():
    assert W.combine("none", NORM) == (NORM, [])
    assert W.combine(GATE, NORM) == (f"{NORM}+{GATE}", [])
    assert W.combine(f"{NORM}+{GATE}", ATTN) == (f"{NORM}+{ATTN}+{GATE}", [])
    # gate_up_silu and silu_mul both rewrite the MLP: the new one replaces the kept one
    assert W.combine(f"{NORM}+{GATE}", SILU) == (f"{NORM}+{SILU}", [GATE])
    assert W.combine(GATE, SILU) == (SILU, [GATE])
    assert W.combine(f"{NORM}+{ATTN}", "add_rmsnorm-9999999999") == (f"add_rmsnorm-9999999999+{ATTN}", [NORM])


def test_every_member_of_a_combination_is_checked_against_the_stack(tmp_path, fresh):
    norm, attn, gate = _kernels(tmp_path, "add_rmsnorm", "decode_attention", "gate_up_silu")
    combo = W.compose([norm, attn, gate])
    W.register_combined(tmp_path, combo)
    knobs = [E.knob(), *[k for k in _engine_knobs() if k.name != "llm_kernel"]]
    assert combo in knobs[0].choices and {norm, attn, gate} <= set(knobs[0].choices)
    cfg = {k.name: k.default for k in knobs}
    check_applicable(knobs, {**cfg, "llm_kernel": combo}, "cpu")
    for knob, value, who, what in (("mlp_kernel", "torch_gate_up", gate, "the MLP"),
                                   ("rmsnorm_impl", "torch_fused", norm, "the RMSNorms"),
                                   ("attention_kernel", "torch_sliced", attn, "the decode attention")):
        with pytest.raises(AdapterError, match=re.escape(f"{who}: the written kernel rewrites {what} itself; {knob} is "
                                                         f"{value}")):
            check_applicable(knobs, {**cfg, "llm_kernel": combo, knob: value}, "cpu")
    with pytest.raises(AdapterError, match=re.escape(f"{attn}: the written decode_attention kernel replaces the sdpa "
                                                     "path of attn_implementation")):
        check_applicable(knobs, {**cfg, "llm_kernel": combo, "attn_implementation": "eager"}, "cpu")
    # a single kernel's refusal reads exactly as before
    mlp = {"mlp_kernel": "torch_gate_up"}
    assert W.conflict(gate, mlp) == written.conflict(gate, mlp) == (
        "the written kernel rewrites the MLP itself; mlp_kernel is torch_gate_up")
    assert "both rewrite the MLP" in W.conflict(f"{gate}+{SILU}", {})


def test_the_phase_registers_combinations_and_a_resume_gets_them_back(tmp_path, fresh, monkeypatch):
    norm, gate = _kernels(tmp_path, "add_rmsnorm", "gate_up_silu")
    combo = f"{norm}+{gate}"
    assert E.knob().choices == ("none", norm, gate)  # kernels alone: the domain as before
    with pytest.raises(ValueError, match=f"{ATTN} is not a written kernel of this session"):
        W.register_combined(tmp_path, f"{norm}+{ATTN}")
    with pytest.raises(ValueError, match="not in the canonical order"):
        W.register_combined(tmp_path, f"{gate}+{norm}")
    W.register_combined(tmp_path, combo)
    W.register_combined(tmp_path, norm)  # a single kernel: registered by written.register already
    assert E.knob().choices == ("none", norm, combo, gate)
    assert json.loads((tmp_path / "llm/kernels/combined.json").read_text()) == [combo]
    assert set(json.loads((tmp_path / "llm/kernels/passed.json").read_text())) == {norm, gate}  # kernels only
    monkeypatch.setattr(written, "_REGISTRY", {})  # a new process: the session's kernels and combinations come back
    monkeypatch.setattr(written, "COMBINED", {})
    assert E.knob().choices == ("none",)
    assert W.restore(tmp_path) == [norm, combo, gate] and E.knob().choices == ("none", norm, combo, gate)
    # a combination whose member is gone from passed.json is no value (its member can't be built)
    book = tmp_path / "llm/kernels/passed.json"
    book.write_text(json.dumps({k: v for k, v in json.loads(book.read_text()).items() if k != gate}))
    monkeypatch.setattr(written, "_REGISTRY", {})
    monkeypatch.setattr(written, "COMBINED", {})
    assert W.restore(tmp_path) == [norm] and E.knob().choices == ("none", norm)


def test_the_diffusers_engine_refuses_any_member_but_add_rmsnorm():
    assert written_rule({"llm_kernel": SILU}, "sd35-tiny") == (
        f"{SILU}: only a written add_rmsnorm kernel has a switch in the diffusers engine")  # as before
    assert written_rule({"llm_kernel": f"{NORM}+{SILU}"}, "sd35-tiny") == (
        f"{NORM}+{SILU}: only a written add_rmsnorm kernel has a switch in the diffusers engine ({SILU} is not one)")
    assert "both rewrite the RMSNorms" in written_rule({"llm_kernel": f"{NORM}+add_rmsnorm-9999999999"}, "sd35-tiny")
    with pytest.raises(ValueError, match="both rewrite the RMSNorms"):
        E.apply_norms([object()], f"{NORM}+add_rmsnorm-9999999999", "eps")
    with pytest.raises(ValueError, match="both rewrite the MLP"):
        E.apply(object(), f"{GATE}+{SILU}")


def test_restore_checked_checks_every_member_and_refuses_a_tampered_one_by_name(tmp_path, fresh, monkeypatch):
    norm, attn = _kernels(tmp_path, "add_rmsnorm", "decode_attention")
    combo = f"{norm}+{attn}"
    W.register_combined(tmp_path, combo)
    monkeypatch.setattr(written, "_REGISTRY", {})  # verify --remeasure's fresh process
    monkeypatch.setattr(written, "COMBINED", {})
    W.restore_checked(tmp_path, [combo])
    assert E.knob().choices == ("none", *sorted((combo, attn, norm)))
    with pytest.raises(written.WrittenKernelError, match="not in the canonical order"):
        W.restore_checked(tmp_path, [f"{attn}+{norm}"])
    kdir = tmp_path / "llm" / "kernels"
    src = (kdir / f"{attn}.py").read_text()
    (kdir / f"{attn}.py").write_text(src + "# changed\n")  # one member changed: refused naming it, not the other
    monkeypatch.setattr(written, "_REGISTRY", {})
    monkeypatch.setattr(written, "COMBINED", {})
    with pytest.raises(written.WrittenKernelError, match=f"^written kernel {attn}: its source {attn}.py has sha256 .*"
                       "the file changed since the session ran it"):
        W.restore_checked(tmp_path, [combo])
    assert combo not in written.registered()
    (kdir / f"{attn}.py").write_text(src)
    (kdir / f"{norm}.py").unlink()
    with pytest.raises(written.WrittenKernelError, match=f"^written kernel {norm}: its source .* is missing"):
        W.restore_checked(tmp_path, [combo])
    with pytest.raises(written.WrittenKernelError, match=f"^written kernel {GATE}: .* has no record of it"):
        W.restore_checked(tmp_path, [f"{attn}+{GATE}"])
