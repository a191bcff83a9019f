"""One inference server as a child process: launch in its own process group,
wait for health, classify a failed launch, stop with no orphan left.

Used by server adapters (``vllm_adapter``). The server's stdout and stderr go
to a log file that is kept (the session directory, under the candidate's id).
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from inferloom.errors import EXIT_RUN_FAILED, InferloomError
from inferloom.process_group import kill_group

__all__ = ["LaunchError", "ServerProcess", "classify_failure", "cause_line", "free_port", "group_alive", "group_cpu_seconds",
           "servers_cpu_seconds", "wait_quiet"]

_LIVE: dict[int, "ServerProcess"] = {}


class LaunchError(InferloomError, RuntimeError):
    """The server did not become healthy. ``kind``: see :func:`classify_failure`;
    ``flag``: the rejected command-line flag, when that is the cause."""

    exit_code = EXIT_RUN_FAILED

    def __init__(self, message: str, kind: str, flag: str | None = None, log_tail: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.flag = flag
        self.log_tail = log_tail


# (kind, pattern) in priority order; the first that matches the log wins.
_PATTERNS: tuple[tuple[str, str], ...] = (
    ("unsupported_flag", r"unrecognized arguments: (--[\w-]+)"),
    ("unsupported_flag", r"argument (--[\w-]+)(?:/[^:]*)?: invalid (?:choice|\w+ value)"),
    ("unsupported_flag", r"argument (--[\w-]+)(?:/[^:]*)?: expected"),
    ("oom", r"(out of memory|OutOfMemoryError|Cannot allocate memory|No available memory for the cache blocks|"
            r"less than desired CPU memory utilization|insufficient memory|"
            r"Not enough memory|leave no GPU memory for the KV cache)"),  # the last two: SGLang's
    ("missing_kernel", r"(NotImplementedError|not supported on (?:the )?CPU|is not supported for|no kernel|"
                       r"Invalid attention backend|undefined symbol|operator \S+ does not exist|"
                       r"(?:backend|Backend) \S+ is not)"),
    ("model_config", r"(config\.json|does not appear to have a file named|Unrecognized model|"
                     r"model type .* not recognized|ValidationError|pydantic)"),
)


def classify_failure(log_text: str, returncode: int | None, timed_out: bool = False) -> tuple[str, str | None]:
    """Pure: (kind, flag) from a failed launch's log. Kinds: unsupported_flag,
    oom, missing_kernel, model_config, startup_timeout, crash."""
    if timed_out:
        return "startup_timeout", None
    for kind, pat in _PATTERNS:
        m = re.search(pat, log_text)
        if m:
            flag = m.group(1) if kind == "unsupported_flag" else None
            return kind, flag
    if returncode is not None and returncode < 0:
        return "crash", None  # killed by a signal
    return "crash", None


#: a log line's own prefix: the process tag, level, timestamp and source vLLM and SGLang put before the message
_LINE_PREFIX = re.compile(r"^(?:\([\w ]+pid=\d+\)\s*)?(?:(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\s+)?"
                          r"(?:\d\d-\d\d \d\d:\d\d:\d\d\s+)?(?:\[[^\]]*\]\s*)?")


def cause_line(log_text: str, kind: str, limit: int = 240) -> str | None:
    """Pure: the log line that made :func:`classify_failure` say ``kind`` (the first that matches its pattern),
    less the process tag, level, time and source; cut at ``limit`` characters. None for a kind no pattern
    gives (startup_timeout, crash) or when no line matches."""
    pats = [pat for k, pat in _PATTERNS if k == kind]
    for line in log_text.splitlines():
        if any(re.search(pat, line) for pat in pats):
            msg = _LINE_PREFIX.sub("", line.strip()).strip()
            return msg if len(msg) <= limit else msg[:limit - 3] + "..."
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a foreign group reusing the id
        return True


def _group_pids(pgid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                out.append(int(d.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of the live processes of a group (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in _group_pids(pgid):
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(f[11]) + int(f[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return total


@dataclass
class ServerProcess:
    argv: list[str]
    env: dict[str, str]
    port: int
    log_path: Path
    proc: subprocess.Popen | None = None
    started_s: float | None = None
    health_s: float | None = None
    notes: dict[str, object] = field(default_factory=dict)
    idle_cpu_floor: float = 0.0  # cores it uses when idle, learned by wait_quiet (SGLang's scheduler polls)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pgid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def start(self, timeout_s: float, progress: Callable[[str], None] = lambda _m: None,
              poll_s: float = 0.1) -> float:
        """Launch and wait until ``/health`` answers 200, asked every ``poll_s``
        (a local request: a short interval costs nothing and the start-up is
        measured, and over, within ``poll_s`` of ready). Returns seconds to
        healthy; raises :class:`LaunchError` (after stopping the group)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        log.write(("$ " + " ".join(self.argv) + "\n").encode())
        log.flush()
        t0 = time.perf_counter()
        try:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, start_new_session=True)
        except OSError as exc:
            log.close()
            raise LaunchError(f"could not execute {self.argv[0]}: {exc}", kind="crash") from None
        finally:
            if self.proc is None:
                log.close()
        log.close()
        _LIVE[self.proc.pid] = self
        last_note = t0
        while True:
            el = time.perf_counter() - t0
            rc = self.proc.poll()
            if rc is not None:
                self.stop()
                text = self.log_path.read_text(errors="replace")
                kind, flag = classify_failure(text, rc)
                tail, why = self.log_tail(25), cause_line(text, kind)
                raise LaunchError(f"server exited with code {rc} after {el:.0f} s ({kind}"
                                  + (f", flag {flag}" if flag else "") + (f": {why}" if why else "")
                                  + f"); log {self.log_path}",
                                  kind=kind, flag=flag, log_tail=tail)
            if el > timeout_s:
                self.stop()
                raise LaunchError(f"server not healthy after {timeout_s:g} s (startup_timeout); log {self.log_path}",
                                  kind="startup_timeout", log_tail=self.log_tail(25))
            if self._healthy():
                self.health_s = el
                return el
            if time.perf_counter() - last_note >= 10:
                progress(f"server on port {self.port}: starting ({el:.0f} s; log {self.log_path.name})")
                last_note = time.perf_counter()
            time.sleep(poll_s)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 15.0) -> dict[str, object]:
        """SIGTERM the whole group, SIGKILL what is left after ``grace_s``,
        then verify that no process of the group remains."""
        if self.proc is None:
            return {"stopped": True}
        pgid = self.proc.pid
        t0 = time.perf_counter()
        how = "already gone"
        if group_alive(pgid):
            how = "SIGTERM"
            kill_group(pgid, signal.SIGTERM)
            deadline = t0 + grace_s
            while time.perf_counter() < deadline:
                self.proc.poll()
                if not group_alive(pgid):
                    break
                time.sleep(0.1)
            if group_alive(pgid):
                how = "SIGKILL after SIGTERM timed out"
                kill_group(pgid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
        for _ in range(50):
            if not group_alive(pgid):
                break
            time.sleep(0.1)
        left = _group_pids(pgid)
        _LIVE.pop(pgid, None)
        out = {"stopped": not left, "how": how, "seconds": time.perf_counter() - t0, "left_pids": left}
        self.notes["stop"] = out
        with open(self.log_path, "a") as f:
            f.write(f"\n[inferloom] stopped: {out}\n")
        if left:
            raise RuntimeError(f"server group {pgid}: processes {left} survived SIGKILL")
        return out


def _stop_all() -> None:  # pragma: no cover - interpreter exit with servers still live
    for sp in list(_LIVE.values()):
        try:
            sp.stop(grace_s=5)
        except Exception:
            pass


atexit.register(_stop_all)


def build_env(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def command(python: str, module_argv: Sequence[str]) -> list[str]:
    return [python, *module_argv]


def servers_cpu_seconds(servers: Sequence["ServerProcess"]) -> float:
    """CPU seconds the live ``servers``' process groups have used."""
    return sum(group_cpu_seconds(s.pgid) for s in servers if s.alive() and s.pgid is not None)


#: how much an idle floor may wander over a wait's second half (SGLang's: 1.00-1.12 cores on the H200)
STEADY_CORES = 0.25
#: the fewest windows that second half spans (a use falling slowly through fewer is not shown to be steady)
STEADY_WINDOWS = 8


def wait_quiet(servers: Sequence["ServerProcess"], window_s: float = 0.25, max_cpu_frac: float = 0.05,
               limit_s: float = 10.0, cpu_seconds: Callable[[Sequence[Any]], float] | None = None,
               learn_after_s: float = 4.0) -> dict[str, object]:
    """Wait until ``servers`` (the idle neighbours of a server under load) use
    under ``max_cpu_frac`` of one core above their idle floor (OpenMP threads
    spin for a while after serving: measured, docs/loadgen.md), at most
    ``limit_s``. A wait that has lasted ``learn_after_s`` (or reaches ``limit_s``)
    with a steady use over its second half (within ``STEADY_CORES``, over at least
    ``STEADY_WINDOWS`` windows) records the least of it as those servers' idle
    floor (``idle_cpu_floor``, per server) and goes on above it: a server that never idles below it (SGLang's scheduler polls
    on one core: 1.00-1.12 cores on the H200, 2026-12-05) costs ``learn_after_s``
    once, not the limit before every run; a vLLM server winding down after serving
    is quiet within ~1.1 s (docs/loadgen.md), well before. Returns what was waited
    and seen."""
    read = cpu_seconds or servers_cpu_seconds
    t0 = time.perf_counter()
    last = None
    alive = [s for s in servers if s.alive()]
    if not alive:
        return {"waited_s": 0.0, "others_cpu_frac": None}
    floor = sum(getattr(s, "idle_cpu_floor", 0.0) for s in alive)
    bound = max_cpu_frac + 1.1 * floor  # the floor's own jitter (measured: +-0.1 core on 1.0)
    seen: list[float] = []
    learned = False

    def learn() -> bool:
        """Steady and above the bound over the wait's second half: that use is the idle servers' floor (not a
        neighbour still winding down)."""
        nonlocal floor, bound, learned
        tail = seen[len(seen) // 2:]
        if learned or len(tail) < STEADY_WINDOWS or min(tail) <= bound or max(tail) - min(tail) > STEADY_CORES:
            return False
        least = min(tail)
        for s in alive:
            s.idle_cpu_floor = least / len(alive)
        floor, bound, learned = least, max_cpu_frac + 1.1 * least, True
        return True

    while time.perf_counter() - t0 < limit_s:
        c0 = read(servers)
        time.sleep(window_s)
        last = (read(servers) - c0) / window_s
        seen.append(last)
        if last <= bound:
            break
        if time.perf_counter() - t0 >= learn_after_s and learn() and last <= bound:
            break
    else:
        learn()
    out: dict[str, object] = {"waited_s": time.perf_counter() - t0, "others_cpu_frac": last}
    if floor:
        out["idle_floor_cpu_frac"] = floor
    return out
