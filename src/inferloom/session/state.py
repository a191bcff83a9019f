"""``state.json``: where an optimization session stands; the single source of truth.

Contract:

* :class:`SessionState` is everything the coordinator needs to continue a
  session (``inferloom resume DIR``) and everything the Orchestrator may read
  to choose the next action; nothing needed for either lives only in memory.
* :func:`save_state` rewrites ``DIR/state.json`` atomically and durably
  (temp file in ``DIR``, write, flush, fsync, ``os.replace``, fsync ``DIR``):
  after a crash at any moment the file is the complete previous or complete
  new state, never a mix. It stamps ``state.updated_at`` and removes temp
  files an earlier killed save left behind. One writer process per session.
* :func:`load_state` returns a validated :class:`SessionState` or raises
  :class:`StateError` whose one-line message says what is wrong with which
  file and what to do (missing file, not JSON, wrong shape, a
  ``schema_version`` newer than this inferloom reads, an invalid field).
* ``last_ledger_seq`` is the last ledger entry the state accounts for. The
  ledger is written first, then the state: after a crash the ledger may hold
  entries past ``last_ledger_seq`` (a step done but not yet reflected here),
  never the reverse. ``pending_action`` names the step started but not
  finished, with the ledger idempotency key it uses, so a resumed coordinator
  re-issues the same step without duplicating ledger entries.
* No secret reaches the file: it is written through :func:`inferloom.redact.redact`
  (a URL's password becomes ``***``; ``run_options.kb_url`` is stored that way
  and ``resume`` asks for the real one again).
* Values must be JSON types with finite numbers: a NaN or inf anywhere makes
  :func:`save_state` raise ``ValueError`` and leaves ``state.json`` unchanged.
"""

from __future__ import annotations

import os
import time
import uuid
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from inferloom.errors import InferloomError
from inferloom.inputs import InputError, load_json
from inferloom.redact import redact
from inferloom.session.atomic import remove_stale_temps, write_json_atomic
from inferloom.session.state_models import SessionExtra, StateModel, Trial

__all__ = [
    "STATE_SCHEMA_VERSION",
    "STATE_FILE",
    "StateError",
    "Phase",
    "Budget",
    "Used",
    "PendingAction",
    "SessionState",
    "new_session_id",
    "save_state",
    "load_state",
]

STATE_SCHEMA_VERSION = 1
STATE_FILE = "state.json"


class StateError(InferloomError, RuntimeError):
    """``state.json`` is missing, unreadable, invalid or from a newer inferloom.

    The message is one line: the file, what is wrong, what to do."""


class Phase(str, Enum):
    """Coordinator phases, in order. DONE: CLOSE finished, nothing left to resume."""

    PRELUDE = "PRELUDE"
    ENABLEMENT = "ENABLEMENT"
    FRAMEWORK = "FRAMEWORK"
    KERNEL = "KERNEL"
    SWEEP = "SWEEP"
    CLOSE = "CLOSE"
    DONE = "DONE"


class Budget(StateModel):
    """Limits: the session closes cleanly when either is used up."""

    minutes: float = Field(gt=0, description="wall-clock budget in minutes")
    trials: int = Field(ge=1, description="maximum candidate trials")


class Used(StateModel):
    """What the session has consumed so far (summed across resumes)."""

    elapsed_s: float = Field(0.0, ge=0)
    trials: int = Field(0, ge=0)


class PendingAction(StateModel):
    """An action the coordinator started but has not finished (for resume)."""

    action: str = Field(min_length=1, description="the action's name, e.g. 'measure_candidate'")
    params: dict[str, Any] = Field(default_factory=dict)
    key: str = Field(min_length=1, description="ledger idempotency key of the action's entry")
    started_at: float = Field(default_factory=time.time, description="unix time")


class SessionState(StateModel):
    """The whole resumable state of one optimization session."""

    schema_version: int = STATE_SCHEMA_VERSION
    session_id: str = Field(min_length=1)
    phase: Phase = Phase.PRELUDE
    cycle: int = Field(0, ge=0, description="FRAMEWORK cycles started; 0 before the first")
    budget: Budget
    used: Used = Field(default_factory=Used)
    device: str = Field("cpu", description="the resolved device: cpu or cuda")
    knobs: list[dict[str, Any]] = Field(default_factory=list, description="the adapter's knob space (Knob.to_dict())")
    pinned: dict[str, Any] = Field(default_factory=dict, description="knobs pinned by the spec")
    workload: dict[str, Any] = Field(default_factory=dict, description="model, dtype, concurrency, input/output length")
    trials: list[Trial] = Field(default_factory=list, description="every measured candidate, in order")
    extra: SessionExtra = Field(default_factory=SessionExtra,
                                description="coordinator bookkeeping (stock objective, warm replay, sweep, ...)")
    stock_config: dict[str, Any] = Field(default_factory=dict)
    stack: dict[str, Any] = Field(default_factory=dict, description="current kept configuration")
    noise_floor: dict[str, Any] | None = Field(
        None, description="A/A noise summary (inferloom.measure.protocol.noise_floor)"
    )
    measured_config_keys: list[str] = Field(
        default_factory=list, description="config_key() of every configuration measured"
    )
    pending_action: PendingAction | None = None
    last_ledger_seq: int = Field(0, ge=0)
    stop_reason: str | None = None
    created_at: float = Field(default_factory=time.time, description="unix time")
    updated_at: float = Field(default_factory=time.time, description="unix time")

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def new_session_id() -> str:
    """A fresh session id: UTC timestamp plus a random suffix (sortable, unique)."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


def save_state(directory: str | os.PathLike[str], state: SessionState) -> Path:
    """Atomically write ``state`` to ``directory/state.json``; returns the path.

    Sets ``state.updated_at`` to now (the object is modified in place)."""
    path = Path(directory) / STATE_FILE
    state.updated_at = time.time()
    write_json_atomic(path, redact(state.to_dict()))
    remove_stale_temps(path)
    return path


def _one_line(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = ".".join(str(x) for x in e["loc"]) or "state"
    more = f" (and {len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"field '{loc}': {e['msg']}{more}"


def load_state(directory: str | os.PathLike[str]) -> SessionState:
    """Read and validate ``directory/state.json``; :class:`StateError` if unusable."""
    path = Path(directory) / STATE_FILE
    if not path.is_file():
        raise StateError(
            f"{path}: not found; {directory} is not a session directory (or the session never "
            "saved its first state); start one with `inferloom optimize SPEC --out DIR`"
        )
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise StateError(f"{path}: cannot be read ({exc.strerror}); check its permissions") from None
    try:
        data = load_json(raw, int64=False)
    except InputError as exc:
        raise StateError(
            f"{path}: not valid JSON ({exc}); it is only ever replaced atomically, so it was "
            "edited or the disk is damaged; restore it from a backup or start a new session"
        ) from None
    if not isinstance(data, dict):
        raise StateError(
            f"{path}: expected a JSON object, got {type(data).__name__}; this is not an "
            "inferloom session state; restore it or start a new session"
        )
    version = data.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise StateError(
            f"{path}: 'schema_version' missing or not an integer (got {version!r}); this is not "
            "an inferloom session state; restore it or start a new session"
        )
    if version > STATE_SCHEMA_VERSION:
        raise StateError(
            f"{path}: schema_version {version} was written by a newer inferloom (this one reads "
            f"up to {STATE_SCHEMA_VERSION}); upgrade inferloom to resume this session"
        )
    if version < STATE_SCHEMA_VERSION:
        raise StateError(
            f"{path}: schema_version {version} is older than this inferloom reads "
            f"({STATE_SCHEMA_VERSION}) and there is no migration; re-run the session with "
            "`inferloom optimize`, or use the inferloom version that wrote it"
        )
    try:
        return SessionState.model_validate(data)
    except ValidationError as err:
        raise StateError(
            f"{path}: invalid, {_one_line(err)}; it was edited or written by a different "
            "inferloom; restore it or start a new session"
        ) from None

