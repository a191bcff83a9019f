"""Child processes in their own process group: a timeout or an interruption
kills everything they started, and (on Linux) they die with inferloom.

Used for a custom workload's entrypoint (:mod:`inferloom.workloads.custom`)
and a Specialist command (:mod:`inferloom.patches.source`); the vLLM server
(:mod:`inferloom.workloads.server_process`) signals its group with
:func:`kill_group` too.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

__all__ = ["kill_group", "die_with_parent", "run_in_group"]


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to the process group ``pgid``; a group already gone is fine."""
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass


def die_with_parent(parent: int | None = None) -> None:
    """In the child: get SIGKILL when inferloom dies (a kill -9 leaves nothing behind). Linux only.
    ``parent``: inferloom's pid; a parent that died before the request took effect (between fork and
    prctl) ends the child at once, since no signal would come then."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort on other platforms
        pass
    if parent is not None and os.getppid() != parent:
        os._exit(137)


def run_in_group(cmd: list[str], *, timeout: float, input: Any = None, **popen: Any) -> tuple[int | None, Any, Any]:
    """Run ``cmd`` in a new process group (stdout and stderr captured, stdin
    from ``input``) and wait at most ``timeout`` seconds: ``(returncode, out,
    err)``, returncode None when it ran past the timeout and its whole group
    was killed. An interruption kills the group and re-raises; a command that
    can't start raises ``OSError``."""
    me = os.getpid()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if input is not None else None, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, preexec_fn=lambda: die_with_parent(me),
                            **popen)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        out, err = proc.communicate()
        return None, out, err
    except BaseException:  # interrupted: never leave it running
        kill_group(proc.pid)
        raise
    return proc.returncode, out, err
