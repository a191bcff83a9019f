"""FRAMEWORK phase: one tick = one robustness check, one orchestrator
proposal (validated against the allowlist and the knob space), and at most one
measured trial judged by a fresh Critic. The coordinator, not an agent, keeps
or reverts: a change is kept only when the protocol keeps it, the quality
contract passes, the gain clears the A/A noise floor, and the Critic agrees.
When a kernel backend applies, FRAMEWORK ends once its part of the budget is
used, leaving ``spec.kernels.budget_share`` to the KERNEL phase.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, Mapping

from inferloom.session import ledger as L
from inferloom.session.allowlist import MAX_CONSECUTIVE_REFUSALS, validate_proposal
from inferloom.session.common import jsonable as _jsonable
from inferloom.session.common import seed_base as _seed_base
from inferloom.session.common import step_key as _key
from inferloom.session.compare import compare, stock_references
from inferloom.session.state import PendingAction, Phase, SessionState
from inferloom.workloads.base import config_key

__all__ = ["agent_view", "framework_step", "noise_floor_gain", "execute_trial", "kept_roofline"]


def agent_view(st: SessionState) -> dict[str, Any]:
    """What agents see: the state as written to disk, plus two derived keys."""
    d = st.to_dict()
    d["started_at"] = st.created_at
    d["proposals"] = list(st.extra.get("proposals", []))
    d["kb_failures"] = list(st.extra.get("kb_failures", []))
    d["cycle_started_at"] = st.extra.get("cycle_started_at", st.created_at)
    return d


def noise_floor_gain(st: SessionState) -> float:
    """The A/A floor as a relative gain: how far stock measured against a second
    instance of itself landed from 1 (|ratio - 1|). A true no-op measures as
    that much by instance effects alone (seen on an H200: -6%), so a kept gain's
    lower bound must clear it as well as ``min_gain``. Random noise is already
    in each trial's own interval; this floor is for the systematic part.
    0.0 when no A/A was measured."""
    nf = st.noise_floor or {}
    r = nf.get("ratio")
    return abs(float(r) - 1.0) if isinstance(r, (int, float)) and math.isfinite(r) else 0.0


def _input_ref(st: SessionState) -> dict[str, Any]:
    """How an agent's input is recorded: the state it read is state.json at this
    point, identified by the ledger seq it had reached and its counters."""
    return {"state_last_ledger_seq": st.last_ledger_seq, "phase": st.phase.value, "cycle": st.cycle,
            "trials": len(st.trials), "stack": dict(st.stack)}


def _tick_key(c: Any, st: SessionState, what: str) -> str:
    return _key(what, st.session_id, st.cycle, len(st.trials), st.extra.get("refusals_total", 0))


def framework_step(c: Any, st: SessionState) -> None:
    if st.pending_action is not None and st.pending_action.action == "try_config":
        execute_trial(c, st, dict(st.pending_action.params), st.pending_action.key)
        return
    from inferloom.session.kernel_phase import kernel_reserve

    reserved = kernel_reserve(c, st)
    if reserved:
        _end(c, st, reserved)
        return
    view = agent_view(st)
    forced = c.robustness.check(view, c.clock())
    if forced is not None:
        c.ledger.append(L.AGENT_IO, {"agent": c.robustness.name, "role": "robustness", "input": _input_ref(st),
                                     "output": _jsonable(forced)},
                        key=_tick_key(c, st, "robustness"))
        if not isinstance(forced, Mapping) or forced.get("action") not in ("end_phase", "stop"):
            c._refuse(st, "malformed_output", "robustness must return end_phase or stop", forced, c.robustness.name)
            st.extra["refusals_total"] = st.extra.get("refusals_total", 0) + 1
            return
        why = f"robustness ({forced.get('rule', '?')}): {forced.get('reason', '')}"
        if forced["action"] == "stop":
            st.stop_reason = why
            c._phase(st, Phase.CLOSE, why)
        else:
            _end(c, st, why)
        return
    if st.extra.get("refusals_in_a_row", 0) >= MAX_CONSECUTIVE_REFUSALS:
        _end(c, st, f"coordinator (refusal_limit): {MAX_CONSECUTIVE_REFUSALS} consecutive refused proposals")
        return

    try:
        raw = c.orchestrator.propose(view)
    except Exception as exc:  # noqa: BLE001 - an agent's crash is a refusal, not the session's end
        raw = {"error": f"{type(exc).__name__}: {exc}"}
    c.ledger.append(L.AGENT_IO, {"agent": c.orchestrator.name, "role": "orchestrator", "input": _input_ref(st),
                                 "output": _jsonable(raw)},
                    key=_tick_key(c, st, "orchestrator"))
    proposal, rule, why = validate_proposal(raw, "FRAMEWORK", view, c.knobs)
    if rule:
        c._refuse(st, rule, why, raw, c.orchestrator.name)
        st.extra["refusals_total"] = st.extra.get("refusals_total", 0) + 1
        return
    st.extra["refusals_in_a_row"] = 0
    if proposal["action"] == "end_phase":
        _end(c, st, f"orchestrator: {proposal.get('rationale', 'nothing left to try')}")
        return
    if proposal["action"] == "stop":
        st.stop_reason = f"orchestrator asked to stop: {proposal.get('rationale', '')}"
        c._phase(st, Phase.CLOSE, st.stop_reason)
        return

    key = _key("try_config", st.session_id, st.cycle, config_key(proposal["config"]))
    st.extra.setdefault("proposals", []).append(proposal["changes"])
    c.ledger.append(L.PROPOSAL, {"agent": c.orchestrator.name, "cycle": st.cycle, "trial": len(st.trials) + 1,
                                 "changes": proposal["changes"], "config": proposal["config"],
                                 "predicted_gain": proposal.get("predicted_gain"),
                                 "source": proposal.get("source"), "rationale": proposal.get("rationale")},
                    key=key + ":proposal")
    st.pending_action = PendingAction(action="try_config", params=_jsonable(proposal), key=key)
    c._save(st)
    execute_trial(c, st, proposal, key)



def _end(c: Any, st: SessionState, why: str) -> None:
    st.extra["proposals"] = []
    c._phase(st, Phase.KERNEL, why)


def execute_trial(c: Any, st: SessionState, proposal: Mapping[str, Any], key: str, *, agent: str | None = None,
                  min_ratio: float | None = None,
                  guard: Callable[[Mapping[str, Any]], tuple[str, str] | None] | None = None) -> dict[str, Any]:
    """Measure a proposal against the stack, have a fresh Critic rule, keep or
    revert, and record it (ledger and state). ``min_ratio``: a keep also needs
    the measured ratio to reach it (warm replay). ``guard(evidence)``: a last
    check before a keep; ``(rule, why)`` turns the keep into outcome ``rule``
    (e.g. a gain larger than Amdahl's law allows). Returns the trial record."""

    agent = agent or c.orchestrator.name
    n = len(st.trials) + 1
    base, cand = dict(st.stack), dict(proposal["config"])
    changes = dict(proposal["changes"])
    left = st.budget.minutes * 60 - st.used.elapsed_s
    c.progress(f"FRAMEWORK cycle {st.cycle}, trial {n}/{st.budget.trials}: "
               f"{', '.join(f'{k}={v}' for k, v in changes.items())}  "
               f"(best so far x{_best(st):.3f} vs stock; {max(0.0, left) / 60:.1f} min left)")
    refs = stock_references(c.adapter, c.spec, st.stock_config, ("eval",), c.refs, c.progress)
    res, mseq = c._measured(key + ":measurement", L.MEASUREMENT, lambda: {
        "action": "try_config", "trial": n, "cycle": st.cycle, "changes": changes, **compare(
            c.adapter, c.spec, base, cand, settings=c.settings, seed_base=_seed_base(c.spec.seed, n), refs=refs,
            quality_sets=("eval",), progress=c.progress, labels=("stack", "candidate"))})
    d = (res.get("protocol") or {}).get("decision") or {}
    q = res.get("quality") or {}
    evidence = {"changes": changes, "protocol_verdict": res.get("verdict"), "ratio": d.get("ratio"),
                "ci_low": d.get("ci_low"), "ci_high": d.get("ci_high"), "n_pairs": d.get("n_pairs"),
                "quality_passed": q.get("passed") if q.get("evaluated") else None,
                "quality_failed": q.get("failed", []), "noise_floor": noise_floor_gain(st),
                "error": res.get("error")}
    critic = c.critic_factory()  # fresh for every decision: no memory of earlier turns
    try:
        ruling = critic.judge(evidence)
    except Exception as exc:  # noqa: BLE001
        ruling = {"error": f"{type(exc).__name__}: {exc}"}
    c.ledger.append(L.AGENT_IO, {"agent": critic.name, "role": "critic", "input": evidence, "output": _jsonable(ruling)},
                    key=key + ":critic")
    ok_shape = isinstance(ruling, Mapping) and ruling.get("decision") in ("keep", "revert")
    if not ok_shape:
        c._refuse(st, "malformed_output", "critic must return decision keep|revert and a lesson", ruling, critic.name)
    allowed = (res.get("verdict") == "keep" and evidence["quality_passed"] is True
               and d.get("ci_low") is not None and d["ci_low"] - 1.0 > noise_floor_gain(st)
               and (min_ratio is None or (d.get("ratio") or 0.0) >= min_ratio))
    keep = bool(ok_shape and ruling["decision"] == "keep" and allowed)
    if ok_shape and ruling["decision"] == "keep" and not allowed:
        c._refuse(st, "critic_keep_without_evidence", "the protocol, quality or noise floor did not support a keep",
                  ruling, critic.name)
    guarded = guard(evidence) if keep and guard is not None else None
    if guarded:
        keep = False
        c.record_refusal(st, guarded[0], guarded[1], "coordinator", {"changes": changes, "ratio": d.get("ratio")},
                         key + ":guard")
    outcome = guarded[0] if guarded else _outcome(res, evidence, keep)
    if not keep and min_ratio is not None and res.get("verdict") == "keep" and (d.get("ratio") or 0.0) < min_ratio:
        outcome = "drift"
    lesson = ruling.get("lesson") if ok_shape and isinstance(ruling.get("lesson"), str) else f"{changes}: {outcome}"
    if guarded:
        lesson = f"{changes}: {guarded[1]}"
    vseq = c.ledger.append(L.VERDICT, {"trial": n, "cycle": st.cycle, "agent": agent, "changes": changes, "config": cand,
                                       "outcome": outcome, "kept": keep, "lesson": lesson,
                                       "protocol_verdict": res.get("verdict"), "ratio": d.get("ratio"),
                                       "ci_low": d.get("ci_low"), "ci_high": d.get("ci_high"),
                                       "quality_passed": evidence["quality_passed"],
                                       "predicted_gain": proposal.get("predicted_gain"),
                                       "measurement_seq": mseq}, key=key + ":verdict")
    st.trials.append({"trial": n, "cycle": st.cycle, "changes": changes, "config": cand, "verdict": outcome,
                      "kept": keep, "ratio": d.get("ratio"), "ci_low": d.get("ci_low"), "ci_high": d.get("ci_high"),
                      "n_pairs": d.get("n_pairs"), "quality_passed": evidence["quality_passed"],
                      "predicted_gain": proposal.get("predicted_gain"), "source": proposal.get("source"),
                      "agent": agent, "lesson": lesson, "measurement_seq": mseq,
                      "verdict_seq": vseq, "finished_at": time.time()})
    st.measured_config_keys.append(config_key(cand))
    st.used.trials += 1
    if keep:
        st.stack = cand
        st.extra["stack_ratio"] = _best(st) * float(d["ratio"])
        kept_roofline(c, st, res, key, st.trials[-1])
    st.pending_action = None
    c.progress(f"  -> {outcome}: {lesson}")
    return st.trials[-1]


def kept_roofline(c: Any, st: SessionState, res: Mapping[str, Any], key: str, trial: dict[str, Any]) -> None:
    """Where a kept stack (``trial``'s config) sits against the roofline: its
    median in the measurement that kept it; recorded once, also across a
    resume. Nothing without ceilings (a warm replay keeps before PRELUDE has
    measured them: PRELUDE calls this again once it has)."""
    from inferloom.session.prelude import ROOFLINE, roofline_for

    vals = [p["value_b"] for p in (res.get("protocol") or {}).get("pairs", []) if p.get("value_b") is not None]
    roof = roofline_for(c, st, statistics.median(vals), dict(trial["config"])) if vals else None
    if roof is None:
        return
    found = c.ledger.find(key + ":roofline")
    seq = found["seq"] if found is not None else c.ledger.append(
        ROOFLINE, {"kept": {"trial": trial["trial"], "cycle": st.cycle, "changes": trial["changes"], "roofline": roof}},
        key=key + ":roofline")
    trial["roofline"] = {"fraction": roof.get("fraction"), "headroom": roof.get("headroom"),
                         "suspect": roof.get("suspect"), "ledger_seq": seq}
    c.progress(f"  roofline: the stack is now at {roof['fraction'] * 100:.1f}% of the ceiling "
               f"(headroom x{roof['headroom']:.2f})" + ("; SUSPECT: above the roofline" if roof.get("suspect") else ""))


def _outcome(res: Mapping[str, Any], ev: Mapping[str, Any], keep: bool) -> str:
    if keep:
        return "keep"
    if res.get("verdict") == "failed":
        return "failed"
    if res.get("verdict") == "keep" and ev.get("quality_passed") is False:
        return "reject-quality"
    if res.get("verdict") == "keep":
        return "below-noise-floor"
    return str(res.get("verdict"))


def _best(st: SessionState) -> float:
    return float(st.extra.get("stack_ratio", 1.0))
