"""The typed parts of ``state.json``: the coordinator's bookkeeping
(``SessionState.extra``, :class:`SessionExtra`) and the trial record
(``SessionState.trials``, :class:`Trial`).

Every model here is written by inferloom alone, so each one forbids keys it
does not declare: an edited or foreign ``state.json`` fails to load with a
one-line :class:`~inferloom.session.state.StateError`, as for the rest of the
state. The JSON keys are the ones sessions have always written, so a state
from before these models loads, and the JSON written now has the same keys
and value shapes:

* a part of the state (:class:`StatePart`) writes the keys that were set,
  by its writer or by the file it was read from, and no others: a warm replay
  that was skipped writes ``skipped`` (and ``lookup_seq`` when a lookup ran),
  one that was measured writes its outcome, each with explicit nulls where
  its writer gave them;
* :class:`SessionExtra` writes every field that is not None: None is "not
  there yet" (no bookkeeping key ever holds null), so a step that starts
  something over (ENABLEMENT re-measuring stock) sets the field back to None.
  Containers a step fills in place (``proposals``, ``sweep``,
  ``kernel_decided``) are None until their first writer creates them, so a
  key appears in the file exactly when it did before.

Where a value is open-ended (a profile's categories, a knob configuration,
what a server adapter learned about a flag, an agent's proposal as given),
the container is typed and the open part stays a dict, with a comment why.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

__all__ = [
    "StateModel",
    "StatePart",
    "RunOptions",
    "StockFailure",
    "StockObjective",
    "WarmReplay",
    "ProfileSummary",
    "Ceilings",
    "RooflineStock",
    "RooflineFinal",
    "KernelTarget",
    "KernelProgress",
    "SweepPoint",
    "KeptCommit",
    "ProtectedFile",
    "ProtectedFiles",
    "SourceState",
    "RollbackDrill",
    "TrialRoofline",
    "Trial",
    "SessionExtra",
]


class StateModel(BaseModel):
    """Base of every model in ``state.json``: unknown keys refused, assignments validated."""

    # NaN / inf stay floats in to_dict() (pydantic would turn them into null), so
    # that write_json_atomic refuses them loudly instead of losing them silently.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, ser_json_inf_nan="constants")


class StatePart(StateModel):
    """A part of the state that writes only the keys that were set (see the module docstring)."""

    @model_serializer(mode="wrap")
    def _set_keys_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        return {k: v for k, v in out.items() if k in self.model_fields_set}


# ------------------------------------------------------------------ PRELUDE / ENABLEMENT


class RunOptions(StatePart):
    """How the session was asked to run (``optimize``'s --cycles, --no-sweep,
    --kb / --no-kb): only the options given; ``resume`` continues with them."""

    cycle_ceiling: int | None = None
    sweep: bool | None = None
    kb_url: str | None = None
    llm_replay: str | None = None


class StockFailure(StatePart):
    """Why the stock baseline failed (ENABLEMENT climbs from here)."""

    error: str | None = None
    kind: str
    seq: int


class StockObjective(StatePart):
    """The stock baseline: the median objective over both arms of the A/A measurement."""

    median: float
    n_runs: int
    ledger_seq: int


class WarmReplay(StatePart):
    """The warm replay's outcome: ``skipped`` (why; ``lookup_seq`` when the KB
    was looked up), or the recipe measured and whether it was adopted."""

    skipped: str | None = None
    lookup_seq: int | None = None
    recipe_id: int | None = None
    adopted: bool | None = None
    ratio: float | None = None
    recorded_gain: float | None = None
    verdict_seq: int | None = None


class ProfileSummary(StatePart):
    """Stock's profile: ``skipped`` (why), or its ledger entry, time shares and error."""

    skipped: str | None = None
    ledger_seq: int | None = None
    # category -> {label, seconds, raw_seconds, share, ...} as the profiler
    # measured them (inferloom.measure.profile; the categories vary by model);
    # a string only when the profiler returned something not JSON (its repr)
    categories: dict[str, Any] | str | None = None
    error: str | None = None


class Ceilings(StatePart):
    """The device's ceilings the roofline divides by (measured, or cached in the KB)."""

    memory_bandwidth_bytes_per_s: float
    matmul_flops_per_s: float
    device_name: str
    matmul_dtype: str
    cached: bool | None = None
    measured_at: str | float  # ISO date; unix time in sessions from before 2026-12


class RooflineStock(StatePart):
    """Where stock sits under the roofline (its ledger entry holds the whole roofline)."""

    ledger_seq: int
    fraction: float | None = None
    headroom: float | None = None
    ceiling_tok_per_s: float | None = None


class RooflineFinal(StatePart):
    """Where the final stack sits under the roofline, and whether its gain is suspect."""

    ledger_seq: int
    fraction: float | None = None
    suspect: bool


# ------------------------------------------------------------------ KERNEL / SWEEP


class KernelTarget(StatePart):
    """A profiled category the KERNEL phase considered (``inferloom.kernels.base.Target``)."""

    category: str
    share: float
    picked: bool
    why: str


class KernelProgress(StatePart):
    """The KERNEL phase of one cycle: its backend, targets and the next candidate to try."""

    cycle: int
    backend: str
    targets: list[KernelTarget]
    next: int
    kept: list[str]  # candidate ids
    stack_at_start: dict[str, Any]  # a knob configuration: knob names vary by adapter


class SweepPoint(StatePart):
    """One SWEEP grid point: the final stack against stock there (or why it does not apply)."""

    point: list[int]  # [concurrency, input length]
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    verdict: str | None = None
    error: str | None = None
    ledger_seq: int | None = None


# ------------------------------------------------------------------ custom workloads


class KeptCommit(StatePart):
    """A source patch kept: its commit on the session branch."""

    id: str
    sha: str
    title: str
    message: str
    verdict_seq: int | None = None
    proposal_key: str
    parent: str | None = None


class ProtectedFile(StatePart):
    """One protected file at stock: its path, git mode (100644, 100755, 120000) and sha256."""

    path: str
    mode: str
    sha256: str


class ProtectedFiles(StatePart):
    """The files no candidate may change (entrypoint, quality gate, benchmark
    inputs, ``custom.patches.protected``), as stock's commit holds them: taken
    once at session start, verified in a candidate's tree before every run.
    ``dirs``: protected directories, where no file may appear or vanish."""

    commit: str
    patterns: list[str]
    files: list[ProtectedFile]
    dirs: list[str]
    ledger_seq: int | None = None


class SourceState(StatePart):
    """A custom workload's source stack: stock's commit, the stack's (stock plus
    the kept commits), the session branch, the patches seen, the sources done."""

    stock: str
    branch: str
    date: int  # commit date of every session commit (unix time): the same commits on a rebuild
    kept: list[KeptCommit]
    seen: list[str]  # patch ids handled
    stack: str
    failed_sources: list[str] | None = None
    exhausted_sources: list[str] | None = None
    protected: ProtectedFiles | None = None  # written at session start (sessions from before: at their next bind)


class RollbackDrill(StatePart):
    """The rollback drill's result (its ledger entry holds the details)."""

    passed: bool
    ledger_seq: int


# ------------------------------------------------------------------ trials


class TrialRoofline(StatePart):
    """Where a kept trial's stack sits under the roofline."""

    fraction: float | None = None
    headroom: float | None = None
    suspect: bool | None = None
    ledger_seq: int


class Trial(StatePart):
    """One measured candidate, as ``state.json`` keeps it
    (:func:`inferloom.phases.trial.trial_record` builds it). ``verdict_seq``
    and ``finished_at`` are null until the verdict is written; ``roofline``
    only on a kept trial once the ceilings are known; ``commit`` only on a
    kept source patch."""

    trial: int
    cycle: int
    changes: dict[str, Any]  # knob -> value (or {"patch": id}): knob names vary by adapter
    config: dict[str, Any]  # the full configuration measured
    verdict: str
    kept: bool
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    n_pairs: int | None = None
    quality_passed: bool | None = None
    predicted_gain: int | float | None = None  # as the agent gave it (an int stays an int in the ledger)
    source: str | None = None
    agent: str
    lesson: str
    measurement_seq: int
    verdict_seq: int | None = None
    finished_at: float | None = None
    roofline: TrialRoofline | None = None
    commit: str | None = None


# ------------------------------------------------------------------ the bookkeeping


class SessionExtra(StateModel):
    """The coordinator's bookkeeping (``state.json``'s ``extra``): what each
    phase recorded for the next tick, a resume, or the agents. A field is None
    until its phase writes it, and is then written to the file."""

    run_options: RunOptions | None = None
    stock_failure: StockFailure | None = None
    enablement_round: int | None = None  # stock re-measured after ENABLEMENT this many times
    # the knobs ENABLEMENT changed to make stock run (a rung-3/5 patch, a rung-4 environment, a rung-2 flag):
    # part of stock from then on (verify --remeasure pins them)
    enablement_changes: dict[str, Any] | None = None
    stock_objective: StockObjective | None = None
    # the changes of recipes that failed on similar workloads (priors that rank
    # proposals down): knob -> value, knob names vary by adapter
    kb_failures: list[dict[str, Any]] | None = None
    warm_replay: WarmReplay | None = None
    profile: ProfileSummary | None = None
    ceilings: Ceilings | None = None
    roofline_stock: RooflineStock | None = None
    cycle_started_at: float | None = None  # unix time the current FRAMEWORK cycle started
    refusals_in_a_row: int | None = None
    refusals_total: int | None = None
    # this cycle's proposals as the agents gave them (a changes mapping, an
    # agent's malformed output, or {"patch": id}): the robustness check reads them
    proposals: list[Any] | None = None
    stack_ratio: float | None = None  # the kept stack's gain over stock (product of kept ratios)
    # flag -> what the server adapter learned when the installed server refused
    # it ({knob, value, kind, whole_flag, ...}: the adapter's own record)
    rejected_flags: dict[str, dict[str, Any]] | None = None
    # knob -> {value, said}: what the stock server's own log said it runs where that differs from the knob's
    # default (workloads/server_says.py); no proposal sets a knob to the value stock already runs
    stock_runs: dict[str, dict[str, Any]] | None = None
    source: SourceState | None = None
    kernel_had_turn: int | None = None  # the cycle the KERNEL phase had its turn in
    # the cycle whose FRAMEWORK ended early to leave the KERNEL phase its share (phases/budget.py): a cycle that
    # then keeps nothing has not converged, its FRAMEWORK gets the rest of the budget in one more cycle
    framework_cut: int | None = None
    kernel: KernelProgress | None = None
    kernel_decided: dict[str, str] | None = None  # candidate id -> how it was decided
    sweep: dict[str, list[SweepPoint]] | None = None  # cycle (as a JSON key) -> its points
    roofline_final: RooflineFinal | None = None
    rollback_drill: RollbackDrill | None = None
    kernel_backend_applies: bool | None = None  # written by inferloom before the KERNEL budget share; read by nothing

    def add_proposal(self, proposal: Any) -> None:
        """Append to this cycle's ``proposals`` (the list is created by the first)."""
        if self.proposals is None:
            self.proposals = []
        self.proposals.append(proposal)

    @model_serializer(mode="wrap")
    def _not_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}
