"""The LLM kernel author's turn in the KERNEL phase (``agents.llm.roles``
names ``kernel_author``), after the backend's candidates.

For each picked target whose category has a written-kernel switch in the
engine (:data:`inferloom.kernels.written.WRITABLE`: ``gemm`` ->
``gate_up_silu``, ``elementwise`` -> ``silu_mul``, ``normalization`` ->
``add_rmsnorm`` (a plain RMSNorm in-process; in a vLLM server with its fused
residual add), ``attention`` -> ``decode_attention`` (not asked,
``kernel_unsupported``, when the stack's ``attn_implementation`` isn't ``sdpa``:
:data:`~inferloom.kernels.written.NEEDS`); the diffusers engine:
:func:`~inferloom.kernels.written.writable`, ``normalization`` only), hottest
first, once per session:

1. the author is asked for a kernel against the catalog entry's signature
   (``agent_io`` entry with its LLM calls; an answer that fails its schema
   after the repair attempt, or a module that does not load, is a refusal with
   its rule);
2. the reward-hacking guards, the correctness gate (at the shown and unseen
   shapes) and the microbenchmark (``kernel_gate`` entries; a failure is a
   refusal with the gate's rule);
3. only then is it registered as a value of the engine's ``llm_kernel`` knob
   and measured end to end with the quality contract against the stack, like
   a catalog kernel (same allowlist, Critic, keep rule and Amdahl check). A
   stack that has written kernels already (``llm_kernel=X``) keeps them: the
   candidate is the combination of X and the new kernel
   (:func:`~inferloom.kernels.written_set.combine`: a member of X that
   rewrites the same modules is replaced by it, as its rationale says).

A candidate the engine's own cross-knob rule refuses on the stack (``CrossKnobRules``: a vLLM stack whose
catalog plugin already replaces that op) is refused ``kernel_conflict`` before its gates. Every refusal is a
``refusal`` ledger entry from ``llm-kernel-author``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inferloom.agents.llm_kernel import gate_written_kernel, written_candidate
from inferloom.agents.llm_record import LLMRefusal
from inferloom.frameworks import framework
from inferloom.kernels import written, written_set
from inferloom.kernels.base import KernelCandidate, workload_of
from inferloom.measure.roofline import amdahl_limit
from inferloom.phases.allowlist import validate_proposal
from inferloom.phases.common import agent_view
from inferloom.phases.common import jsonable as _jsonable
from inferloom.phases.common import step_key as _key
from inferloom.phases.context import SessionContext
from inferloom.phases.kernel_trial import KERNEL_CLAIM, KERNEL_GATE, decided, kernel_trial, share
from inferloom.session import ledger as L
from inferloom.session.state import SessionState
from inferloom.session.state_models import KernelProgress
from inferloom.workloads.base import CrossKnobRules, config_key
from inferloom.workloads.registry import written_served

__all__ = ["AGENT", "author_entries", "author_categories", "author_step"]

AGENT = "llm-kernel-author"
GATES = ("reward_hacking_guards", "correctness", "microbenchmark")


def author_categories(ctx: SessionContext) -> frozenset[str]:
    """The profile categories the author may write for (none without the role)."""
    if getattr(ctx.agents, "kernel_author", None) is None:
        return frozenset()
    return frozenset(written.writable(ctx.spec.framework) or written.WRITABLE)  # another engine: refused, no switch


def author_entries(ctx: SessionContext, ks: KernelProgress) -> list[str]:
    """The catalog entries the author is asked for, hottest picked target first."""
    if not author_categories(ctx):
        return []
    out: list[str] = []
    for t in ks.targets:
        name = (written.writable(ctx.spec.framework) or written.WRITABLE).get(t.category)
        if t.picked and name and name not in out:
            out.append(name)
    return out


def _done(st: SessionState, ks: KernelProgress, i: int, entry: str, how: str) -> None:
    decided(st)[f"llm:{entry}"] = f"cycle {st.cycle}: {how}"
    ks.next = i + 1


def _refuse(ctx: SessionContext, st: SessionState, ks: KernelProgress, i: int, entry: str, rule: str, why: str,
            output: dict[str, Any]) -> None:
    ctx.record_refusal(st, rule, why, AGENT, {"entry": entry, **output},
                       _key("kernel-llm-refusal", st.session_id, st.cycle, entry, rule))
    _done(st, ks, i, entry, f"refused ({rule})")


def _ask(ctx: SessionContext, st: SessionState, entry: Any, dtype: str, shown: list[dict[str, int]]) -> dict[str, Any]:
    """The author's answer for ``entry`` as recorded (asked now unless the ledger has it)."""
    key = _key("kernel-llm", st.session_id, st.cycle, entry.name)
    found = ctx.ledger.find(key)
    if found is not None:
        return found["output"]
    ctx.progress(f"KERNEL: asking the LLM kernel author for {entry.name} ({entry.target_op})")
    try:
        _, calls, wrote = ctx.agents.kernel_author.write(entry, dtype, shown)
        out: dict[str, Any] = {**wrote, "path": f"llm/kernels/{Path(wrote['path']).name}", "llm_calls": calls}
    except LLMRefusal as exc:
        out = {"refused": {"rule": exc.rule, "why": exc.why}, "llm_calls": exc.calls}
    ctx.ledger.append(L.AGENT_IO, {"agent": AGENT, "role": "kernel_author", "input": {"entry": entry.name, "dtype": dtype,
                                                                                       "shown": shown},
                                   "output": _jsonable(out)}, key=key)
    return out


def _gates(ctx: SessionContext, st: SessionState, cand: KernelCandidate, shown: list[dict[str, int]],
           served: KernelCandidate | None = None) -> list[dict]:
    """The gates' results (recorded; a resumed session reads them back when the last one is there)."""
    keys = [_key("kernel-gate", st.session_id, st.cycle, cand.id, g) for g in GATES]
    found = [ctx.ledger.find(k) for k in keys]
    have = [f for f in found if f is not None]
    if have and (not have[-1]["passed"] or len(have) == len(GATES)):
        return have
    ctx.progress(f"KERNEL gates (guards, correctness, microbenchmark): {cand.id}")
    out = []
    for res, key in zip(gate_written_kernel(cand, st.device, shown, min_speedup=ctx.spec.kernels.min_speedup,
                                               served=served), keys):
        d = _jsonable(res.to_dict())
        ctx.ledger.append(KERNEL_GATE, {"cycle": st.cycle, "candidate": cand.id, "author": AGENT, **d}, key=key)
        out.append(d)
    return out


def _stacked(value: str, name: str, dropped: list[str]) -> str:
    """What the candidate does to the written kernels the stack has (nothing for a stack without any)."""
    what = written.REPLACES[written.entry_of(name)][2]
    out = "".join(f"; replaces the stack's {m} (it rewrites {what} too)" for m in dropped)
    others = [m for m in written_set.members(value) if m != name]
    return out + (f"; measured with the stack's {' and '.join(others)} as {written.KNOB}={value}" if others else "")


def author_step(ctx: SessionContext, st: SessionState, ks: KernelProgress, i: int, entry_name: str) -> None:
    """One tick of the author's turn for ``entry_name`` (position ``i`` of the phase's list)."""
    from inferloom.kernels.catalog.index import get  # needs triton (an optional dependency)

    if f"llm:{entry_name}" in decided(st):
        ctx.progress(f"KERNEL: the author's {entry_name} was decided earlier: {decided(st)[f'llm:{entry_name}']}")
        ks.next = i + 1
        return
    ctx.knobs = ctx.adapter.knob_space()  # the llm_kernel knob's domain grows as kernels pass their gates
    if written.KNOB not in {k.name for k in ctx.knobs}:
        _refuse(ctx, st, ks, i, entry_name, "kernel_no_engine_switch",
                f"the {ctx.spec.framework} engine has no {written.KNOB} knob to switch a written kernel on", {})
        return
    entry = get(entry_name)
    work = workload_of(ctx.spec, st.device, ks.stack_at_start or st.stack)
    dtype = str(work["dtype"])
    why = entry.unsupported(dtype, st.device) or written.stack_refusal(entry_name, ks.stack_at_start or st.stack)
    if why:
        _refuse(ctx, st, ks, i, entry_name, "kernel_unsupported", why, {})
        return
    shown = written.shown_shapes(entry_name, work)
    ans = _ask(ctx, st, entry, dtype, shown)
    if ans.get("refused"):
        _refuse(ctx, st, ks, i, entry_name, ans["refused"]["rule"], ans["refused"]["why"], {})
        return
    path = ctx.dir / ans["path"]
    try:
        fn = written.import_kernel(path)
    except Exception as exc:  # noqa: BLE001 - loaded when asked; a file changed since is a refusal too
        _refuse(ctx, st, ks, i, entry_name, "kernel_load_failed", f"{path.name}: {type(exc).__name__}: {exc}", {})
        return
    name = str(ans["name"])
    # added to the written kernels the stack has (one that rewrites the same modules replaced: written_set.combine)
    value, dropped = written_set.combine(str(st.stack.get(written.KNOB, "none")), name)
    changes: dict[str, Any] = {written.KNOB: value}
    for m in written_set.members(value):  # the switch each member replaces, set back to its untouched value
        own, untouched, _ = written.REPLACES[written.entry_of(m)]
        if st.stack.get(own, untouched) != untouched:
            changes[own] = untouched
    clash = ctx.adapter.config_refusal({**st.stack, **changes}) if isinstance(ctx.adapter, CrossKnobRules) else None
    if clash:  # the engine's own rule (a vLLM plugin: one replacement per op, the stack's catalog one kept)
        _refuse(ctx, st, ks, i, entry_name, "kernel_conflict", clash, {})
        return
    cand = written_candidate(entry, dtype, shown, fn, name, float(ans["claimed_speedup"]),
                             f"written by the LLM kernel author: {str(ans.get('rationale'))[:300]}")
    category = next(c for c, e in written.WRITABLE.items() if e == entry_name)  # the profile's name for the op
    cand = KernelCandidate(**{**cand.__dict__, "config_changes": changes, "target": category,
                              "covers": written.COVERS.get(entry_name, ())})  # its Amdahl share: the catalog's
    ctx.ledger.append(KERNEL_CLAIM, {"cycle": st.cycle, "backend": AGENT, "candidate": cand.to_record()},
                      key=_key("kernel-claim", st.session_id, st.cycle, cand.id))
    try:  # the kernel as the server runs it (vLLM: its plugin's forward, compiled when the server compiles)
        served = written_served(framework(ctx.spec.framework), work, entry_name, name, path,
                                cand.claimed_speedup)
    except Exception as exc:  # noqa: BLE001 - the author's module is imported again for it
        _refuse(ctx, st, ks, i, entry_name, "kernel_load_failed", f"{path.name} as the server runs it: "
                f"{type(exc).__name__}: {exc}", {"candidate": cand.id})
        return
    results = _gates(ctx, st, cand, shown, served)
    for r in results:
        ctx.progress(f"  {r['gate']}: {'pass' if r['passed'] else 'refused (' + str(r['rule']) + ')'}: {r['why']}")
    if not results[-1]["passed"]:
        _refuse(ctx, st, ks, i, entry_name, str(results[-1]["rule"]), str(results[-1]["why"]), {"candidate": cand.id})
        return
    written.register(ctx.dir, name, entry_name, path)
    written_set.register_combined(ctx.dir, value)
    ctx.knobs = ctx.adapter.knob_space()
    proposal, rule, why = validate_proposal({"action": "try_kernel", "changes": changes, "source": AGENT,
                                             "candidate": cand.id}, "KERNEL", agent_view(st), ctx.knobs)
    if rule:
        _refuse(ctx, st, ks, i, entry_name, rule, why, {"candidate": cand.id})
        return
    frac, spans = share(ks.targets, cand)
    local = results[-1]["details"].get("speedup")
    bound = amdahl_limit(min(max(float(frac), 0.0), 1.0), float(local)) if frac is not None and local else None
    proposal.update(predicted_gain=(bound - 1.0) if bound is not None else None, amdahl_bound=bound,
                    rationale=f"{cand.id}: written for {cand.op}; guards and gates passed (x{local:.2f} on the op); "
                    "Amdahl bound " + (f"x{bound:.3f} from its {frac * 100:.1f}% share ({spans})" if bound else "unknown")
                    + _stacked(value, name, dropped))
    decided(st)[f"llm:{entry_name}"] = f"cycle {st.cycle}: gates passed, measured end to end"
    kernel_trial(ctx, st, ks, proposal, _key("try_kernel", st.session_id, st.cycle, config_key(proposal["config"])),
                 first=True)
