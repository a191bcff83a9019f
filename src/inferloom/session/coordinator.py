"""The coordinator: code, not an agent. It runs every benchmark, applies and
reverts changes, enforces the phase allowlists, and persists state.

Phases: PRELUDE (stock baseline + A/A noise floor) -> ENABLEMENT (only when
stock fails) -> FRAMEWORK (configuration search) -> KERNEL (skipped, with its
reason, until a kernel backend exists) -> SWEEP (final stack vs stock over a
concurrency x input-length grid; skipped with its reason when nothing was
kept this cycle) -> another cycle at FRAMEWORK, or CLOSE.

Every tick re-reads ``state.json`` (the source of truth), does one step, and
writes it back atomically before the next. A step that measures first records
itself as ``pending_action`` with a ledger key; its ledger entries carry keys
derived from it, so after a crash ``resume`` reuses a measurement that reached
the ledger instead of measuring again, and never duplicates an entry.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from inferloom.measure import protocol as proto
from inferloom.session import ledger as L
from inferloom.session.allowlist import (
    MAX_CONSECUTIVE_REFUSALS,
    PHASE_ALLOWLIST,
    validate_proposal,
)
from inferloom.session.common import jsonable as _jsonable
from inferloom.session.common import median_objective
from inferloom.session.common import seed_base as _seed_base
from inferloom.session.common import step_key as _key
from inferloom.session.compare import References, compare
from inferloom.spec import objective_label
from inferloom.session.state import (
    PendingAction,
    Phase,
    SessionState,
    load_state,
    save_state,
)
from inferloom.workloads.base import config_key

__all__ = ["PHASE_ALLOWLIST", "MAX_CONSECUTIVE_REFUSALS", "Coordinator", "validate_proposal"]

Progress = Callable[[str], None]


class Coordinator:
    """Drives one session directory. ``run()`` returns when the session is DONE."""

    def __init__(self, directory: Any, spec: Any, adapter: Any, *, orchestrator: Any, critic_factory: Callable[[], Any],
                 robustness: Any, progress: Progress = lambda _m: None, cycle_ceiling: int = 3,
                 sweep: bool = True, sweep_pairs: int = 3, adapter_factory: Callable[[Any], Any] | None = None,
                 kb_url: str | None = "default", replay_min_confidence: float = 0.5, replay_fraction: float = 0.5,
                 clock: Callable[[], float] = time.time, kernel_backend: Any = None) -> None:
        from pathlib import Path

        self.dir = Path(directory)
        self.spec = spec
        self.adapter = adapter
        self.orchestrator = orchestrator
        self.critic_factory = critic_factory
        self.robustness = robustness
        self.progress = progress
        self.cycle_ceiling = cycle_ceiling
        self.do_sweep = sweep
        self.sweep_pairs = sweep_pairs
        if kb_url == "default":
            from inferloom.kb import default_kb_url

            kb_url = default_kb_url()
        self.kb_url = kb_url  # None: no knowledge base
        self.replay_min_confidence = replay_min_confidence
        self.replay_fraction = replay_fraction
        self.adapter_factory = adapter_factory or (lambda _spec: adapter)
        self.clock = clock
        self.kernel_backend = kernel_backend  # None: spec.kernels.backend decides
        self.knobs = adapter.knob_space()
        if hasattr(adapter, "set_log_dir"):  # server adapters keep each server's log in the session
            adapter.set_log_dir(self.dir / "servers", progress=progress)
        self.settings = proto.ProtocolSettings.from_spec(spec.protocol)
        self.refs = References()
        self.ledger = L.Ledger(self.dir)
        if self.ledger.recovered_torn_line:
            self.ledger.append(L.ERROR, {"what": "recovered a torn last ledger line after a crash",
                                         "dropped_bytes": len(getattr(self.ledger, "torn_bytes", b"") or b"")})
        self._tick_t = self.clock()
        if getattr(spec, "framework", None) == "custom":
            from inferloom.patches.session import bind_session

            bind_session(self)  # the workspace and the stock / stack source trees (issue 6)

    # ---------------------------------------------------------------- helpers
    def _save(self, st: SessionState) -> None:
        now = self.clock()
        st.used.elapsed_s += max(0.0, now - self._tick_t)
        self._tick_t = now
        st.last_ledger_seq = self.ledger.last_seq
        save_state(self.dir, st)

    def time_left_s(self, st: SessionState) -> float:
        return st.budget.minutes * 60 - st.used.elapsed_s

    def _budget_reason(self, st: SessionState) -> str | None:
        if st.used.elapsed_s >= st.budget.minutes * 60:
            return f"budget: {st.budget.minutes:g} wall-clock minutes used"
        if st.used.trials >= st.budget.trials:
            return f"budget: {st.budget.trials} trials used"
        return None

    def _phase(self, st: SessionState, phase: Phase, why: str) -> None:
        self.ledger.append(L.PHASE, {"from": st.phase.value, "to": phase.value, "cycle": st.cycle, "why": why},
                           key=_key("phase", st.session_id, st.phase.value, phase.value, st.cycle, len(st.trials)))
        self.progress(f"phase {st.phase.value} -> {phase.value}: {why}")
        st.phase = phase

    def record_refusal(self, st: SessionState, rule: str, why: str, agent: str, output: Any, key: str) -> None:
        """One refusal entry in the ledger (the one place they are written) and its progress line."""
        self.ledger.append(L.REFUSAL, {"rule": rule, "why": why, "agent": agent, "output": _jsonable(output),
                                       "phase": st.phase.value, "cycle": st.cycle}, key=key)
        self.progress(f"refused ({rule}): {why}")

    def _refuse(self, st: SessionState, rule: str, why: str, raw: Any, agent: str) -> None:
        """An agent's output refused: recorded, and counted toward the refusal limit."""
        self.record_refusal(st, rule, why, agent, raw,
                            _key("refusal", st.session_id, st.cycle, len(st.trials), st.extra.get("refusals_total", 0), rule))
        st.extra["refusals_in_a_row"] = st.extra.get("refusals_in_a_row", 0) + 1
        st.extra.setdefault("proposals", []).append(_jsonable(raw.get("changes") if isinstance(raw, Mapping) else raw))

    def _measured(self, key: str, kind: str, fn: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], int]:
        """Reuse a measurement already in the ledger under ``key``, else take it."""
        found = self.ledger.find(key)
        if found is not None:
            self.progress("resume: reusing the measurement already in the ledger")
            return found, found["seq"]
        res = fn()
        seq = self.ledger.append(kind, res, key=key)
        return res, seq

    # ------------------------------------------------------------------ run
    def close(self) -> None:
        self.ledger.close()

    def run(self) -> SessionState:
        while True:
            st = load_state(self.dir)
            if st.phase == Phase.DONE:
                return st
            reason = self._budget_reason(st)
            if reason and not st.stop_reason and st.phase in (Phase.FRAMEWORK, Phase.ENABLEMENT):
                # The search stops; the stack found so far is still swept (time
                # permitting) and compared against stock at CLOSE.
                st.stop_reason = reason
                st.pending_action = None
                st.extra["proposals"] = []
                self._phase(st, Phase.KERNEL if st.phase == Phase.FRAMEWORK else Phase.CLOSE, reason)
                self._save(st)
                continue
            _sync_rejected_flags(self, st, restore=True)
            step = getattr(self, "_step_" + st.phase.value.lower())
            step(st)
            _sync_rejected_flags(self, st, restore=False)
            self._save(st)

    # --------------------------------------------------------------- PRELUDE
    def _step_prelude(self, st: SessionState) -> None:
        from inferloom.session.prelude import profile_step, replay_step

        if "stock_objective" not in st.extra:
            self._measure_stock(st)
        elif "warm_replay" not in st.extra:
            replay_step(self, st)
        elif "profile" not in st.extra:
            profile_step(self, st)
        else:
            st.cycle = 1
            st.extra["cycle_started_at"] = self.clock()
            so = st.extra["stock_objective"]
            self._phase(st, Phase.FRAMEWORK, f"stock {so['median']:,.1f} {objective_label(self.spec)}; A/A floor "
                        f"{abs((st.noise_floor or {}).get('ratio', 1.0) - 1) * 100:.2f}%; starting stack "
                        + ("from the knowledge base" if st.stack != st.stock_config else "stock"))

    def _measure_stock(self, st: SessionState) -> None:
        key = _key("measure_stock", st.session_id, st.extra.get("enablement_round", 0))
        st.pending_action = PendingAction(action="measure_stock", key=key)
        self._save(st)
        self.progress("PRELUDE: stock baseline and A/A noise floor (stock against itself)")
        res, seq = self._measured(key, L.MEASUREMENT, lambda: {
            "action": "measure_stock", **compare(
                self.adapter, self.spec, st.stock_config, st.stock_config, settings=self.settings,
                seed_base=_seed_base(self.spec.seed, 0), refs=None, progress=self.progress,
                stop_early=False, labels=("stock", "stock-2"))})
        st.pending_action = None
        if res["verdict"] == "failed":
            st.extra["stock_failure"] = {"error": res.get("error"), "kind": res.get("error_kind", "error"), "seq": seq}
            self._phase(st, Phase.ENABLEMENT, f"stock failed: {res.get('error')}")
            return
        stock = median_objective(res, "value_a", "value_b")
        st.noise_floor = {**res["noise"], "ledger_seq": seq}
        st.extra["stock_objective"] = {"median": stock, "n_runs": 2 * len(res["protocol"]["pairs"]), "ledger_seq": seq}
        if config_key(st.stock_config) not in st.measured_config_keys:
            st.measured_config_keys.append(config_key(st.stock_config))
        self.progress(f"PRELUDE: stock {stock:,.1f} {objective_label(self.spec)}; A/A ratio {res['noise']['ratio']:.4f} "
                      f"[{res['noise']['ci_low']:.4f}, {res['noise']['ci_high']:.4f}]")

    # ------------------------------------------------------------ ENABLEMENT
    def _step_enablement(self, st: SessionState) -> None:
        from inferloom.session.enablement import climb

        outcome = climb(self, st)
        if outcome is None:
            st.stop_reason = st.stop_reason or "enablement: stock could not be made to run"
            self._phase(st, Phase.CLOSE, st.stop_reason)
        else:
            st.stock_config = outcome
            st.stack = dict(outcome)
            st.extra.pop("stock_objective", None)
            st.extra["enablement_round"] = st.extra.get("enablement_round", 0) + 1
            self._phase(st, Phase.PRELUDE, "enablement recovered stock; re-measuring the baseline")

    # ------------------------------------------------------------- FRAMEWORK
    def _step_framework(self, st: SessionState) -> None:
        from inferloom.session.framework import framework_step

        if getattr(self.spec, "framework", None) == "custom":
            from inferloom.patches.session import patch_framework_step

            patch_framework_step(self, st)  # source patches first, then the configuration search
            return
        framework_step(self, st)

    # ---------------------------------------------------------------- KERNEL
    def _step_kernel(self, st: SessionState) -> None:
        from inferloom.session.kernel_phase import kernel_step

        kernel_step(self, st)

    # ----------------------------------------------------------------- SWEEP
    def _step_sweep(self, st: SessionState) -> None:
        from inferloom.session.sweep import sweep_step

        sweep_step(self, st)

    # ----------------------------------------------------------------- CLOSE
    def _step_close(self, st: SessionState) -> None:
        from inferloom.session.close import close_step

        close_step(self, st)


def _sync_rejected_flags(c: "Coordinator", st: SessionState, *, restore: bool) -> None:
    """Flags the installed server rejected (learned by a server adapter from a
    launch error) live in the session state: restored into the adapter after a
    resume, and read by ``validate_proposal`` so they are never proposed again.
    Each newly learned flag is also a ledger entry."""
    learned = getattr(c.adapter, "rejected_flags", None)
    if learned is None:
        return
    if restore and st.extra.get("rejected_flags"):
        c.adapter.restore_rejected_flags(st.extra["rejected_flags"])
    elif not restore and learned:
        known = st.extra.get("rejected_flags") or {}
        for flag in sorted(set(learned) - set(known)):
            c.ledger.append(L.ERROR, {"what": "server rejected a flag; never proposed again in this session",
                                      "flag": flag, **{("failure_kind" if k == "kind" else k): v for k, v in learned[flag].items()}},
                           key=_key("rejected_flag", st.session_id, flag))
            c.progress(f"learned: the server rejects {flag} ({learned[flag].get('knob')}); never proposed again")
        st.extra["rejected_flags"] = {k: dict(v) for k, v in learned.items()}
