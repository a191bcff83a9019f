"""KERNEL phase: one backend proposes kernel replacements for the hot ops of
the current stack; the coordinator trusts none of its claims.

One tick does one thing, so a kill at any point resumes cleanly:

1. (first tick of a cycle) resolve the backend (``spec.kernels.backend``, or
   the session's ``SessionOptions.kernel_backend``), profile the current stack (stock's
   PRELUDE profile when the stack is stock), select targets by time share and
   by what the backend can rewrite (ledger ``kernel_targets``: every category
   with why it was picked or passed over). No backend or no target: the
   phase is skipped with its reason.
2. per candidate: its claim is recorded ``unverified`` (``kernel_claim``);
   for a ``guarded`` backend (a server's plugin) the reward-hacking guards,
   then the correctness gate, then the microbenchmark gate (``kernel_gate``
   entries; a failure is a refusal with the gate's rule); then the paired
   end-to-end measurement with the quality contract against the stack, like
   any FRAMEWORK trial (same Critic, same keep rule). A measured gain larger
   than Amdahl's law allows from the op's time share and its microbenchmark
   speed-up is refused (``amdahl_suspect``) and measured once more; only that
   second measurement can keep it.
3. then, when ``agents.llm.roles`` names ``kernel_author``, the LLM writes
   kernels for the picked targets it can (``phases/kernel_llm.py``): guards,
   the same gates, then the same end-to-end measurement.
4. when every candidate is done (or the budget is used): SWEEP.
"""

from __future__ import annotations

from typing import Any

from inferloom.kernels.base import KernelCandidate, Target, workload_of
from inferloom.kernels.gates import GateResult, correctness, microbenchmark
from inferloom.kernels.guards import reward_hacking_guards as _guards
from inferloom.kernels.select import select_targets
from inferloom.measure.profile import profile_config
from inferloom.measure.roofline import amdahl_limit
from inferloom.phases.allowlist import validate_proposal
from inferloom.phases.backend_choice import kernel_backend
from inferloom.phases.common import agent_view
from inferloom.phases.common import jsonable as _jsonable
from inferloom.phases.common import step_key as _key
from inferloom.phases.context import SessionContext
from inferloom.phases.roofline import PROFILE
from inferloom.phases import server_profile
from inferloom.phases.kernel_llm import author_categories, author_entries, author_step
from inferloom.phases.kernel_trial import AMDAHL_TOLERANCE, KERNEL_CLAIM, KERNEL_GATE
from inferloom.phases.kernel_trial import decided as _decided
from inferloom.phases.kernel_trial import kernel_trial as _trial
from inferloom.phases.kernel_trial import share as _share
from inferloom.session import ledger as L
from inferloom.session.state import Phase, SessionState
from inferloom.session.state_models import KernelProgress
from inferloom.workloads.base import DeclaredProfile, config_key
from inferloom.frameworks import framework

__all__ = ["kernel_step", "kernel_backend", "KERNEL_TARGETS", "KERNEL_CLAIM", "KERNEL_GATE", "AMDAHL_TOLERANCE",
           "UNPROFILED"]

KERNEL_TARGETS = "kernel_targets"
UNPROFILED = -1.0  # a target's share when the session has no profile to take it from (the backend's fixed order)


def _to_sweep(ctx: SessionContext, st: SessionState, why: str, skipped: bool) -> None:
    st.extra.kernel_had_turn = st.cycle  # done or skipped: FRAMEWORK keeps no reserve for it after this
    if skipped:
        ctx.ledger.append(L.PHASE, {"action": "skip_phase", "phase": "KERNEL", "cycle": st.cycle, "reason": why},
                        key=_key("kernel-skip", st.session_id, st.cycle))
    ctx.enter_phase(st, Phase.SWEEP, ("KERNEL skipped: " if skipped else "KERNEL done: ") + why)


def _stack_categories(ctx: SessionContext, st: SessionState) -> tuple[dict[str, Any] | None, int | None, str]:
    """The time shares of the current stack: (categories, ledger seq, where from)."""
    if isinstance(ctx.adapter, DeclaredProfile):  # the synthetic adapter declares its pretend profile
        return ctx.adapter.profile_categories(st.stack), None, "the synthetic adapter's declared profile"
    prof = st.extra.profile
    if st.stack == st.stock_config and prof is not None and isinstance(prof.categories, dict) and prof.categories:
        return prof.categories, prof.ledger_seq, "stock's PRELUDE profile" + (" (the server's own profiler)" if
                                                                              framework(ctx.spec.framework).profile_skip else "")
    skip = framework(ctx.spec.framework).profile_skip
    key = _key("profile-kernel", st.session_id, st.cycle)
    if skip:  # a server: its own profiler, when PRELUDE took one of stock (phases/server_profile.py)
        if prof is None or prof.skipped or prof.error or prof.ledger_seq is None:
            why = (prof.skipped or f"stock's profile failed ({prof.error})") if prof else skip
            return None, prof.ledger_seq if prof else None, f"the session has no profile of the stack: {why}"
        wanted, why = server_profile.decide(ctx, st, *kernel_backend(ctx, st))
        if not wanted:
            return None, None, f"no profile of the current stack (it differs from stock): {why}"
        found = server_profile.take(ctx, st, st.stack, key, "the current stack", why, cycle=st.cycle)
    else:
        found = ctx.ledger.find(key)
    if found is None:
        ctx.progress("KERNEL: profiling one untimed run of the current stack (torch.profiler)")
        try:
            res = profile_config(ctx.adapter, st.stack)
        except Exception as exc:  # noqa: BLE001 - no profile is a reason to skip, not a crash
            res = {"error": f"{type(exc).__name__}: {exc}"}
        seq = ctx.ledger.append(PROFILE, {"profile": _jsonable(res), "stack": dict(st.stack), "cycle": st.cycle}, key=key)
        found = {"profile": res, "seq": seq}
    p = found.get("profile") or {}
    if p.get("error") or not p.get("categories"):
        return None, found["seq"], f"the stack's profile failed: {p.get('error')}"
    return p["categories"], found["seq"], "a profile of the current stack"


def _begin(ctx: SessionContext, st: SessionState) -> KernelProgress | None:
    backend, why = kernel_backend(ctx, st)
    if backend is None:
        _to_sweep(ctx, st, why, skipped=True)
        return None
    cats, pseq, source = _stack_categories(ctx, st)
    order = getattr(backend, "fixed_order", None)
    if not cats and order is None:
        _to_sweep(ctx, st, f"no profile to pick targets from ({source})", skipped=True)
        return None
    ks = ctx.spec.kernels
    if cats:
        targets = select_targets(cats, backend.rewritable() | author_categories(ctx), ks.min_share)
    else:  # the backend's fixed, documented order; no time share is claimed (no Amdahl bound)
        targets = [Target(c, UNPROFILED, c in backend.rewritable(), "not profiled: the backend's fixed order")
                   for c in order()]
        source = f"{source}; {backend.name}'s fixed order instead: {', '.join(order())}"
        ctx.progress(f"KERNEL: {source}")
    ctx.ledger.append(KERNEL_TARGETS, {"cycle": st.cycle, "backend": backend.name, "profile_seq": pseq,
                                     "profile_source": source, "targets": [t.to_dict() for t in targets]},
                    key=_key("kernel-targets", st.session_id, st.cycle))
    for t in targets:
        share = "not profiled" if t.share == UNPROFILED else f"{t.share * 100:.1f}%"
        ctx.progress(f"KERNEL: {'target' if t.picked else 'passed over'} {t.category} ({share}): {t.why}")
    if not any(t.picked for t in targets):
        _to_sweep(ctx, st, f"{backend.name}: no profiled category is both hot enough and rewritable", skipped=True)
        return None
    st.extra.kernel = KernelProgress(cycle=st.cycle, backend=backend.name, targets=[t.to_dict() for t in targets],
                                     next=0, kept=[], stack_at_start=dict(st.stack))
    return st.extra.kernel


def _candidates(ctx: SessionContext, st: SessionState, ks: KernelProgress) -> list[KernelCandidate]:
    backend, _ = kernel_backend(ctx, st)
    targets = [Target(**t.model_dump()) for t in ks.targets]
    work = workload_of(ctx.spec, st.device, ks.stack_at_start or st.stack)
    return list(backend.propose(targets, work)) if backend is not None else []


def reward_hacking_guards(cand: KernelCandidate, device: str) -> GateResult:
    """The guards (kernels/guards.py) as the first gate of a ``guarded`` backend's candidates, at the shapes
    the candidate declares and shapes moved from them."""
    return _guards(cand, device, cand.shapes)


def _gates(backend: Any) -> tuple[Any, ...]:
    """The gates a backend's candidates pass, in order: the guards first for a ``guarded`` backend (one whose
    kernels run where only the end-to-end quality contract watches them: a server's plugin)."""
    return ((reward_hacking_guards,) if getattr(backend, "guarded", False) else ()) + (correctness, microbenchmark)


def _refuse(ctx: SessionContext, st: SessionState, cand_id: str, rule: str, why: str, agent: str) -> None:
    ctx.record_refusal(st, rule, why, agent, {"candidate": cand_id},
                     _key("kernel-refusal", st.session_id, st.cycle, cand_id, rule))


def kernel_step(ctx: SessionContext, st: SessionState) -> None:
    if st.stop_reason:
        _to_sweep(ctx, st, st.stop_reason, skipped=True)
        return
    ks = st.extra.kernel
    if ks is None or ks.cycle != st.cycle:
        ks = _begin(ctx, st)
        return  # state saved; candidates from the next tick on
    if st.pending_action is not None and st.pending_action.action == "try_kernel":
        _trial(ctx, st, ks, dict(st.pending_action.params), st.pending_action.key)
        return
    reason = ctx.budget_reason(st)
    if reason:
        st.stop_reason = reason
        _to_sweep(ctx, st, reason, skipped=False)
        return
    cands = _candidates(ctx, st, ks)
    i = ks.next
    if i >= len(cands):  # the backend's candidates are done: the LLM kernel author's turn (if it plays)
        written = author_entries(ctx, ks)
        if i < len(cands) + len(written):
            author_step(ctx, st, ks, i, written[i - len(cands)])
            return
        kept = ks.kept
        _to_sweep(ctx, st, f"{len(cands)} candidate(s) from {ks.backend}"
                  + (f" and {len(written)} asked of the LLM kernel author" if written else "")
                  + f", {len(kept)} kept" + (f" ({', '.join(kept)})" if kept else ""), skipped=False)
        return
    cand = cands[i]
    agent = f"kernel:{ks.backend}"
    backend = kernel_backend(ctx, st)[0]
    merge = getattr(backend, "merge", None)  # a backend whose knob values combine (a server's plugin: one overlay)
    changes = dict(merge(st.stack, cand.config_changes) if callable(merge) else cand.config_changes)
    if all(st.stack.get(k) == v for k, v in changes.items()):
        ctx.progress(f"KERNEL candidate {i + 1}/{len(cands)}: {cand.id} is already in the stack")
        ks.next = i + 1
        return
    decided = _decided(st)
    if cand.id in decided:  # gates don't depend on the stack; an end-to-end verdict stands for the session
        ctx.progress(f"KERNEL candidate {i + 1}/{len(cands)}: {cand.id} was decided in an earlier cycle: {decided[cand.id]}")
        ks.next = i + 1
        return
    # can it be measured at all (knob space, phase, pinned, measured before)? Checked before the gates spend time.
    proposal, rule, why = validate_proposal({"action": "try_kernel", "changes": changes,
                                             "source": agent, "candidate": cand.id}, "KERNEL", agent_view(st), ctx.knobs)
    if rule:
        _refuse(ctx, st, cand.id, rule, why, agent)
        ks.next = i + 1
        return
    ctx.ledger.append(KERNEL_CLAIM, {"cycle": st.cycle, "backend": ks.backend, "candidate": cand.to_record()},
                    key=_key("kernel-claim", st.session_id, st.cycle, cand.id))
    ctx.progress(f"KERNEL candidate {i + 1}/{len(cands)}: {cand.id} for {cand.op} (claims x{cand.claimed_speedup:.2f}, "
               "unverified)")
    device = st.device
    results = {}
    for gate in _gates(backend):
        gkey = _key("kernel-gate", st.session_id, st.cycle, cand.id, gate.__name__)
        found = ctx.ledger.find(gkey)
        if found is None:
            ctx.progress(f"KERNEL gate {gate.__name__}: {cand.id}")
            kw = {"min_speedup": ctx.spec.kernels.min_speedup} if gate is microbenchmark else {}
            res = gate(cand, device, **kw).to_dict()
            ctx.ledger.append(KERNEL_GATE, {"cycle": st.cycle, "candidate": cand.id, **_jsonable(res)}, key=gkey)
        else:
            res = found
        results[gate.__name__] = res
        ctx.progress(f"  {res['gate']}: {'pass' if res['passed'] else 'refused (' + str(res['rule']) + ')'}: {res['why']}")
        if not res["passed"]:
            _refuse(ctx, st, cand.id, res["rule"], res["why"], agent)
            _decided(st)[cand.id] = f"cycle {st.cycle}: refused ({res['rule']})"
            ks.next = i + 1
            return
    share, spans = _share(ks.targets, cand)
    local = results["microbenchmark"]["details"].get("speedup")
    bound = amdahl_limit(min(max(float(share), 0.0), 1.0), float(local)) if share is not None and local else None
    proposal.update(predicted_gain=(bound - 1.0) if bound is not None else None, amdahl_bound=bound,
                    rationale=f"{cand.id}: {cand.op}; gates passed (x{local:.2f} on the op); Amdahl bound "
                    + (f"x{bound:.3f} from its {share * 100:.1f}% share ({spans})" if bound else "unknown"))
    key = _key("try_kernel", st.session_id, st.cycle, config_key(proposal["config"]))
    _trial(ctx, st, ks, proposal, key, first=True)
