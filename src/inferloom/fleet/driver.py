"""Run a planned fleet on Ray: one task per session, scheduled so that sessions warm-start each other.

* Ray: an embedded local instance by default (``ray.init(address="local")``
  on this machine, ``num_cpus`` / ``num_gpus`` as given or detected: a
  ``ray start`` cluster on the same machine is not joined by accident);
  ``address`` (or ``$RAY_ADDRESS``, which ``ray job submit`` sets) joins an
  existing cluster (``ray start --head`` on one node, ``ray start
  --address=HEAD:6379`` on the others; ``auto``: the latest ``ray start`` on
  this machine). A Ray instance already started in this process (a test's) is
  used as it is, and left running.
* Each session is a task with the resources it needs (``num_gpus=1`` for a GPU
  session, ``num_cpus=cpus`` for a CPU one) and ``max_retries``: when its worker
  process dies (killed, out of memory, a node lost) Ray runs it again, and
  :func:`~inferloom.fleet.worker.run_session` resumes the directory.
* The driver submits the leaders first, and each group's followers once their
  leader has finished (:mod:`inferloom.fleet.plan`); it polls the session
  directories for live progress lines and rewrites the fleet report while the
  fleet runs. A rerun skips closed sessions and resumes unfinished ones.
* The session directories must be on a filesystem every node sees (the driver
  reads them, a retried task may land on another node).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

try:
    import ray
except ImportError:  # an optional dependency (the `fleet` extra): run_fleet says so
    ray = None

from inferloom.fleet.plan import FleetError, FleetPlan, PlannedSession
from inferloom.fleet.report import write_fleet_report
from inferloom.fleet.status import SessionStatus, fleet_status, session_status
from inferloom.fleet.worker import run_session
from inferloom.kb.db import default_kb_url, to_url
from inferloom.redact import redact_url
from inferloom.report.artifacts import write_html
from inferloom.session.atomic import write_json_atomic

__all__ = ["FleetResult", "run_fleet", "MAX_RETRIES"]

MAX_RETRIES = 3  # Ray re-runs a session task this often after its worker died


@dataclass
class FleetResult:
    statuses: list[SessionStatus]
    report: Any
    skipped: list[str]          # closed before this run: not run again

    @property
    def ok(self) -> bool:
        return all(s.status == "done" for s in self.statuses)


def _check_plan_file(plan: FleetPlan) -> None:
    """A fleet directory keeps its plan (fleet_plan.json); a rerun must not give a session another spec."""
    path = plan.out / "fleet_plan.json"
    if path.is_file():
        old = {s["name"]: s for s in json.loads(path.read_text()).get("sessions", [])}
        for s in plan.sessions:
            o = old.get(s.name)
            if o and o.get("spec_hash") != s.spec_hash and (plan.session_dir(s) / "state.json").exists():
                raise FleetError(f"{plan.out}: session {s.name} was started with another spec (fleet_plan.json); "
                                 "keep the fleet file as it was, or give this fleet another --out")
    write_json_atomic(path, {"sessions": [s.public() for s in plan.sessions], "kb": redact_url(plan.kb)})


def _ensure_ray(address: str | None, num_cpus: float | None, num_gpus: int | None,
                progress: Callable[[str], None]) -> bool:
    """Start or join Ray; True when this call started it (and should stop it)."""
    if ray.is_initialized():
        return False
    kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        progress(f"ray: joining the cluster at {address}")
        try:
            ray.init(address=address, **kw)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise FleetError(f"could not join the Ray cluster at {address}: {(str(exc).splitlines() or [''])[0]}; "
                             "check `ray status` on its head node, or leave out --address (and RAY_ADDRESS) "
                             "for an embedded Ray") from None
    else:
        progress("ray: starting an embedded local instance (about 10 s)")
        ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, **kw)
    res = ray.cluster_resources()
    progress(f"ray: {res.get('CPU', 0):g} CPUs, {res.get('GPU', 0):g} GPUs on {len(ray.nodes())} node(s)")
    return True


def _fits(plan: FleetPlan) -> None:
    res = ray.cluster_resources()
    for s in plan.sessions:
        if s.gpus > res.get("GPU", 0) or s.cpus > res.get("CPU", 0):
            raise FleetError(f"session {s.name} needs {s.gpus} GPU(s) and {s.cpus:g} CPU(s); the Ray cluster has "
                             f"{res.get('GPU', 0):g} GPU(s) and {res.get('CPU', 0):g} CPU(s): it would wait forever "
                             "(join a cluster with --address, or change the fleet's devices / defaults.cpus)")


def run_fleet(plan: FleetPlan, *, address: str | None = None, num_cpus: float | None = None,
              num_gpus: int | None = None, progress: Callable[[str], None] = lambda _m: None,
              poll_s: float = 2.0) -> FleetResult:
    """Run every unfinished session of ``plan``; returns when all have finished (closed or failed)."""
    if ray is None:
        raise FleetError("inferloom fleet needs Ray, which is not installed: pip install 'inferloom[fleet]' "
                         "(ray, and psycopg for a PostgreSQL KB)")
    started_at = time.time()
    kb_url = to_url(plan.kb) if plan.kb else default_kb_url()
    plan.out.mkdir(parents=True, exist_ok=True)
    _check_plan_file(plan)
    owned = _ensure_ray(address, num_cpus, num_gpus, progress)
    try:
        _fits(plan)
        task = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=False)(run_session)
        skipped = [s.name for s in plan.sessions if session_status(plan, s).status == "done"]
        if skipped:
            progress(f"{len(skipped)} session(s) already closed, not run again: {', '.join(skipped)}")
        pending: dict[Any, PlannedSession] = {}

        def submit(s: PlannedSession) -> None:
            if s.name in skipped:
                finished(s, None)
                return
            opts = {"num_cpus": s.cpus, "num_gpus": s.gpus, "name": f"inferloom-session-{s.name}"}
            ref = task.options(**opts).remote(s.to_dict(), str(plan.session_dir(s)), kb_url, str(plan.out / "logs"))
            pending[ref] = s
            progress(f"{s.name}: submitted ({s.device}, {s.gpus} GPU, {s.cpus:g} CPU"
                     + (f"; after {s.after}, for its recipe" if s.after else "") + ")")

        def finished(s: PlannedSession, result: dict[str, Any] | None) -> None:
            if result is not None:
                progress(f"{s.name}: " + (f"closed: {result.get('stop_reason')}" if result.get("ok")
                                          else f"failed: {result.get('error')}"))
                d = plan.session_dir(s)
                if (d / "ledger.jsonl").is_file() and (d / "session_breakdown.json").is_file():
                    try:
                        write_html(d)
                    except Exception as exc:  # the fleet report links to it; its absence is shown
                        progress(f"{s.name}: report.html not written: {exc}")
            for f in plan.followers(s.name):
                submit(f)

        for s in plan.leaders():
            submit(s)
        last: dict[str, str] = {}
        next_report = 0.0
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=poll_s)
            for ref in ready:
                s = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayError as exc:  # type: ignore[union-attr]  # retries exhausted (worker died each time), or Ray itself
                    result = {"name": s.name, "ok": False,
                              "error": f"{type(exc).__name__} after {MAX_RETRIES} retries: "
                                       f"{str(exc).splitlines()[0] if str(exc) else ''}; rerun the fleet to resume it"}
                    write_json_atomic(plan.out / "logs" / f"{s.name}.result.json", result)
                finished(s, result)
            statuses = fleet_status(plan)
            for st in statuses:
                if st.status == "running" and last.get(st.name) != st.line():
                    last[st.name] = st.line()
                    progress(st.line())
            if time.monotonic() >= next_report:
                write_fleet_report(plan, statuses, started_at=started_at, live=True, kb_url=kb_url)
                next_report = time.monotonic() + 5 * poll_s
        statuses = fleet_status(plan)
        report = write_fleet_report(plan, statuses, started_at=started_at, live=False, kb_url=kb_url)
        done = sum(s.status == "done" for s in statuses)
        progress(f"fleet: {done}/{len(statuses)} sessions closed; report {report}")
        return FleetResult(statuses, report, skipped)
    finally:
        if owned:
            ray.shutdown()
