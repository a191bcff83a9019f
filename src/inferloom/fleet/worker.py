"""One fleet session, as a Ray task runs it: start the session directory, or resume it.

:func:`run_session` is idempotent by construction: a directory with a state.json
is resumed (``inferloom resume``: the ledger's idempotency keys mean nothing
is measured or written twice), a closed one is left alone, an empty one is
started. So Ray may run it again after its worker died (the task's
``max_retries``) and a rerun of the fleet may run it again: nothing is lost or
repeated. It never raises for a session's own failure: the result says what
failed, so one failed session doesn't stop the others. Progress lines and the
KB's retry warnings go to ``OUT/logs/NAME.log``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from inferloom.kb.db import FLEET_KB_RETRY_S
from inferloom.phases.runner import resume, start
from inferloom.redact import redact_text
from inferloom.session.atomic import write_json_atomic
from inferloom.session.state import Phase, load_state
from inferloom.spec import WorkloadSpec

__all__ = ["run_session"]


@contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """``env`` set for the session, the worker's own restored after (Ray reuses workers)."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _Redacting(logging.Formatter):
    """A log line without URL passwords (a KB URL quoted in a retry warning)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


@contextmanager
def _kb_log(log: Any) -> Iterator[None]:
    """The KB's warnings (a retry while its server is away) into the session's fleet log."""
    handler = logging.StreamHandler(log)
    handler.setFormatter(_Redacting("%(asctime)s %(message)s", "%H:%M:%S"))
    kb_log = logging.getLogger("inferloom.kb")
    kb_log.addHandler(handler)
    try:
        yield
    finally:
        kb_log.removeHandler(handler)


def _ray_node_id() -> str | None:
    """The Ray node this attempt runs on (None outside a Ray worker): which machine of a cluster ran it."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except Exception:  # noqa: BLE001 - no Ray, or an older one: the host name still says where
        return None


def run_session(entry: Mapping[str, Any], session_dir: str, kb_url: str | None, logs: str) -> dict[str, Any]:
    """Run (start or resume) the planned session ``entry`` (:class:`PlannedSession` as a dict) in
    ``session_dir`` against ``kb_url``; returns ``{name, ok, session_id, stop_reason | error, attempt}``."""
    name = entry["name"]
    d, logdir = Path(session_dir), Path(logs)
    logdir.mkdir(parents=True, exist_ok=True)
    with open(logdir / f"{name}.lock", "a+", encoding="utf-8") as lock:
        try:  # one process per session directory: a dead holder's lock is released by the kernel
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return {"name": name, "ok": False, "attempt": 0,
                    "error": f"{d} is being run by another worker (see {logdir / (name + '.worker.json')}); "
                             "wait for it, or stop it, then run the fleet again"}
        return _run_locked(entry, d, logdir, kb_url)


def _run_locked(entry: Mapping[str, Any], d: Path, logdir: Path, kb_url: str | None) -> dict[str, Any]:
    name = entry["name"]
    result_file = logdir / f"{name}.result.json"
    result_file.unlink(missing_ok=True)
    worker_file = logdir / f"{name}.worker.json"
    attempt = 1 + (json.loads(worker_file.read_text())["attempt"] if worker_file.exists() else 0)
    write_json_atomic(worker_file, {"pid": os.getpid(), "host": socket.gethostname(), "attempt": attempt,
                                    "started_at": time.time(), "ray_node_id": _ray_node_id(),
                                    # Ray gives a GPU task its own device(s):
                                    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})
    out: dict[str, Any] = {"name": name, "attempt": attempt}
    with open(logdir / f"{name}.log", "a", encoding="utf-8", buffering=1) as log, \
            _environment({"INFERLOOM_KB_RETRY_S": os.environ.get("INFERLOOM_KB_RETRY_S") or str(FLEET_KB_RETRY_S),
                          **(entry.get("env") or {})}), _kb_log(log):
        def progress(msg: str) -> None:
            log.write(f"{time.strftime('%H:%M:%S')} {redact_text(msg)}\n")  # no password in a log

        try:
            if (d / "state.json").exists():
                progress(f"attempt {attempt} on {socket.gethostname()} (pid {os.getpid()}): resuming {d}")
                st = resume(d, progress=progress, kb_url=kb_url)
            else:
                progress(f"attempt {attempt} on {socket.gethostname()} (pid {os.getpid()}): starting {d}")
                spec = WorkloadSpec.model_validate(entry["spec"])
                st = start(d, spec, budget_minutes=entry["budget_minutes"], max_trials=entry["max_trials"],
                           progress=progress, cycle_ceiling=entry["cycles"], sweep=entry["sweep"], kb_url=kb_url)
            out.update(ok=st.phase == Phase.DONE, session_id=st.session_id, stop_reason=st.stop_reason)
            if st.phase != Phase.DONE:
                out["error"] = f"stopped in phase {st.phase.value} without closing"
        except Exception as exc:  # a session's failure is data: the fleet goes on
            progress("failed:\n" + traceback.format_exc())
            out.update(ok=False, error=redact_text(f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"))
            try:
                out["session_id"] = load_state(d).session_id
            except Exception:  # no state yet: the session never started
                out["session_id"] = None
        progress(f"result: {json.dumps(out, default=str)}")
    write_json_atomic(result_file, out)
    return out
