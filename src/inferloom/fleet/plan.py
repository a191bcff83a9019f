"""A fleet file (FLEET.yaml) -> the planned sessions, in the order that lets them warm-start each other.

Format (every key optional except ``matrix`` or ``sessions``; unknown keys refused)::

    out: runs/fleet-demo            # the fleet directory (--out overrides); sessions/<name>/ under it
    kb: postgresql+psycopg://user@host/db   # the shared KB (--kb, then $INFERLOOM_KB override it)
    order: leaders-first             # or all-at-once: no session waits for another
    defaults: {budget_minutes: 5, max_trials: 4, cycles: 3, sweep: true, cpus: 1, env: {}}
    matrix:                          # the cross product workloads x devices x budgets
      workloads:                     # a spec path (relative to this file), or {name, spec, set}
        - examples/llama-tiny.yaml
        - {name: syn, set: {model: llama-tiny, framework: synthetic}}
      devices: [cpu]                 # default: each spec's own device
      budgets: [{minutes: 2, trials: 2}]
    sessions:                        # and/or one by one
      - {workload: examples/llama-tiny.yaml, device: cpu, budget: {minutes: 2, trials: 2}, name: one, env: {}}

Each planned session is an ordinary session directory ``OUT/sessions/NAME``.
Warm starts: sessions whose workloads share a KB group (model, framework,
dtype, device: what the recipe key is made of) form a chain; the first one
(the group's *leader*) runs first and the others start when it has closed,
so its recipe is in the KB for their PRELUDE lookup. Groups run in parallel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from inferloom.errors import InferloomError
from inferloom.inputs import InputError, load_yaml
from inferloom.spec import SpecError, WorkloadSpec, load_spec, spec_hash

__all__ = ["FleetError", "ORDERS", "PlannedSession", "FleetPlan", "load_fleet", "MAX_SESSIONS"]

MAX_SESSIONS = 10_000
_TOP = {"out", "kb", "order", "defaults", "matrix", "sessions"}
ORDERS = ("leaders-first", "all-at-once")
_DEFAULTS = {"budget_minutes": 5.0, "max_trials": 4, "cycles": 3, "sweep": True, "cpus": 1.0, "env": {}}


class FleetError(InferloomError, ValueError):
    """A fleet file that can't be planned: one line naming the file, the entry and what to fix."""


@dataclass
class PlannedSession:
    """One session of the fleet: its name (and directory), its validated spec and how to run it."""

    name: str
    spec: dict[str, Any]                    # WorkloadSpec.model_dump(): validated, portable to a Ray worker
    device: str                             # the resolved device (cpu, cuda)
    budget_minutes: float
    max_trials: int
    cycles: int
    sweep: bool
    cpus: float                             # Ray resources: CPU cores (1 for a GPU session)
    gpus: int                               # 1 for a GPU session, else 0
    env: dict[str, str] = field(default_factory=dict)
    group: str = ""                         # warm-start group (see the module docstring)
    after: str | None = None                # the leader this session waits for
    spec_hash: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def public(self) -> dict[str, Any]:
        """What fleet_plan.json and ``--plan`` show: no spec body, and the env's names only (values may be secrets)."""
        return {**{k: v for k, v in self.__dict__.items() if k != "spec"}, "env": sorted(self.env)}


@dataclass
class FleetPlan:
    out: Path
    kb: str | None
    sessions: list[PlannedSession]

    def session_dir(self, s: PlannedSession | str) -> Path:
        return self.out / "sessions" / (s if isinstance(s, str) else s.name)

    def leaders(self) -> list[PlannedSession]:
        return [s for s in self.sessions if s.after is None]

    def followers(self, name: str) -> list[PlannedSession]:
        return [s for s in self.sessions if s.after == name]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.")[:60] or "workload"


def _mapping(value: Any, where: str, allowed: set[str] | None = None) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise FleetError(f"{where}: expected a mapping, got {type(value).__name__}")
    if allowed is not None and set(value) - allowed:
        raise FleetError(f"{where}: unknown key(s) {sorted(set(value) - allowed)}; expected some of {sorted(allowed)}")
    return dict(value)


def _workload(entry: Any, base: Path, where: str) -> tuple[str, Path | None, dict[str, Any]]:
    """(name, spec path or None, dotted overrides) of one workload entry."""
    if isinstance(entry, str):
        entry = {"spec": entry}
    w = _mapping(entry, where, {"name", "spec", "set"})
    path = (base / str(w["spec"])) if w.get("spec") is not None else None
    if path is not None and not path.is_file():
        raise FleetError(f"{where}: spec file {path} not found (a spec path is relative to the fleet file)")
    sets = _mapping(w.get("set") or {}, f"{where}.set")
    name = str(w.get("name") or (path.stem if path else sets.get("model") or "workload"))
    return _slug(name), path, sets


def _budget(b: Any, d: Mapping[str, Any], where: str) -> tuple[float, int]:
    b = _mapping(b if b is not None else {}, where, {"minutes", "trials"})
    minutes, trials = b.get("minutes", d["budget_minutes"]), b.get("trials", d["max_trials"])
    if not (isinstance(minutes, (int, float)) and not isinstance(minutes, bool) and 0 < minutes <= 10080):
        raise FleetError(f"{where}.minutes: got {minutes!r}, expected a number over 0 and at most 10080")
    if not (isinstance(trials, int) and not isinstance(trials, bool) and 1 <= trials <= 10_000):
        raise FleetError(f"{where}.trials: got {trials!r}, expected an integer from 1 to 10000")
    return float(minutes), trials


def _defaults(raw: Any, where: str) -> dict[str, Any]:
    d = {**_DEFAULTS, **_mapping(raw or {}, where, set(_DEFAULTS))}
    if not (isinstance(d["cycles"], int) and 1 <= d["cycles"] <= 100):
        raise FleetError(f"{where}.cycles: got {d['cycles']!r}, expected an integer from 1 to 100")
    if not isinstance(d["sweep"], bool):
        raise FleetError(f"{where}.sweep: got {d['sweep']!r}, expected true or false")
    if not (isinstance(d["cpus"], (int, float)) and 0 < d["cpus"] <= 1024):
        raise FleetError(f"{where}.cpus: got {d['cpus']!r}, expected a number of cores over 0")
    d["env"] = {str(k): str(v) for k, v in _mapping(d["env"], f"{where}.env").items()}
    _budget(None, d, where)
    return d


def _one(file: Path, where: str, wl: Any, device: Any, budget: Any, d: Mapping[str, Any],
         name: str | None = None, env: Any = None) -> PlannedSession:
    wname, path, sets = _workload(wl, file.parent, f"{where}.workload")
    overrides = dict(sets)
    if device is not None:
        if device not in ("cpu", "cuda", "auto"):
            raise FleetError(f"{where}.device: got {device!r}, expected cpu, cuda or auto")
        overrides["device"] = device
    try:
        spec: WorkloadSpec = load_spec(path, overrides)
    except SpecError as exc:
        raise FleetError(f"{where}: {exc}") from None
    minutes, trials = _budget(budget, d, f"{where}.budget")
    dev = spec.resolved_device()
    gpu = dev != "cpu"
    auto = f"{wname}-{dev}-{minutes:g}m{trials}t"
    return PlannedSession(name=_slug(name) if name else auto, spec=spec.model_dump(mode="json"), device=dev,
                          budget_minutes=minutes, max_trials=trials, cycles=d["cycles"], sweep=d["sweep"],
                          cpus=1.0 if gpu else float(d["cpus"]), gpus=1 if gpu else 0,
                          env={**d["env"], **{str(k): str(v) for k, v in _mapping(env or {}, f"{where}.env").items()}},
                          group=f"{spec.model}|{spec.framework}|{spec.dtype}|{dev}", spec_hash=spec_hash(spec))


def load_fleet(path: str | Path, out: str | Path | None = None, kb: str | None = None) -> FleetPlan:
    """Read and plan a fleet file; ``out`` / ``kb`` override its own. One :class:`FleetError` line if bad."""
    file = Path(path)
    if not file.is_file():
        raise FleetError(f"fleet file '{path}': not found; expected a YAML fleet file (docs/fleet.md)")
    try:
        raw = load_yaml(file.read_bytes())
    except InputError as exc:
        raise FleetError(f"fleet file '{path}': {exc}") from None
    top = _mapping(raw, f"fleet file '{path}'", _TOP)
    if not top.get("matrix") and not top.get("sessions"):
        raise FleetError(f"fleet file '{path}': no sessions; give a `matrix:` (workloads x devices x budgets) "
                         "or a `sessions:` list")
    d = _defaults(top.get("defaults"), "defaults")
    planned: list[PlannedSession] = []
    if top.get("matrix"):
        m = _mapping(top["matrix"], "matrix", {"workloads", "devices", "budgets"})
        wls, devs, buds = m.get("workloads"), m.get("devices") or [None], m.get("budgets") or [None]
        if not isinstance(wls, list) or not wls:
            raise FleetError("matrix.workloads: expected a non-empty list of spec paths or {name, spec, set}")
        for what, v in (("devices", devs), ("budgets", buds)):
            if not isinstance(v, list):
                raise FleetError(f"matrix.{what}: expected a list")
        if len(wls) * len(devs) * len(buds) > MAX_SESSIONS:
            raise FleetError(f"matrix: {len(wls) * len(devs) * len(buds)} sessions; at most {MAX_SESSIONS}")
        for i, wl in enumerate(wls):
            for dev in devs:
                for b in buds:
                    planned.append(_one(file, f"matrix.workloads[{i}]", wl, dev, b, d))
    sessions = top.get("sessions") or []
    if not isinstance(sessions, list):
        raise FleetError("sessions: expected a list of {workload, device, budget, name}")
    for i, e in enumerate(sessions):
        e = _mapping(e, f"sessions[{i}]", {"workload", "device", "budget", "name", "env"})
        if "workload" not in e:
            raise FleetError(f"sessions[{i}]: no workload; expected a spec path or {{name, spec, set}}")
        planned.append(_one(file, f"sessions[{i}]", e["workload"], e.get("device"), e.get("budget"), d, e.get("name"),
                            e.get("env")))
    if len(planned) > MAX_SESSIONS:
        raise FleetError(f"fleet file '{path}': {len(planned)} sessions; at most {MAX_SESSIONS}")
    taken: set[str] = set()
    for s in planned:  # unique names: a repeated one gets -2, -3, ... (skipping any name already taken)
        base, n = s.name, 1
        while s.name in taken:
            n += 1
            s.name = f"{base}-{n}"
        taken.add(s.name)
    order = top.get("order", ORDERS[0])
    if order not in ORDERS:
        raise FleetError(f"order: got {order!r}, expected one of {', '.join(ORDERS)}")
    leader: dict[str, str] = {}
    for s in planned if order == ORDERS[0] else ():
        s.after = leader.get(s.group)
        leader.setdefault(s.group, s.name)
    out_dir = Path(out) if out else (file.parent / str(top["out"]) if top.get("out") else Path("runs") / f"fleet-{_slug(file.stem)}")
    return FleetPlan(out=out_dir.absolute(), kb=kb or top.get("kb"), sessions=planned)
