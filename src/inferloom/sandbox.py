"""The sandbox untrusted code runs in: bubblewrap (``bwrap``, Debian package
``bubblewrap``). A source patch is code that will run, so a custom workload's
entrypoint (which runs the user's quality gate too) and a Specialist command
run inside it (docs/security.md).

What :meth:`Sandbox.wrap` gives the command:

* the whole filesystem read-only (``--ro-bind / /``), writable only the paths
  the caller names (a run's source tree and its result directory; a
  Specialist's working directory) and a private ``/tmp`` (a tmpfs, also
  ``$TMPDIR``); a private ``/dev`` (GPU device nodes bound in when present)
  and ``/proc`` of its own PID namespace, ``/proc/sys`` read-only;
* no network (``--unshare-net``: only a loopback of its own), and ``/run``
  hidden (the host's UNIX sockets, e.g. a Docker daemon's, live there);
* its own PID and IPC namespaces, no capabilities (``--cap-drop ALL``: root
  outside stays root in name only, it can't remount anything), a new session
  (no controlling terminal);
* common credential files of ``$HOME`` hidden (:data:`SECRET_PATHS`);
* ``--die-with-parent``: it dies with inferloom (the caller's process group
  kill, :mod:`inferloom.process_group`, still applies).

:func:`resolve` decides, once per spec, whether commands run sandboxed: the
spec's ``custom.sandbox`` is ``bwrap`` (the default: sandboxed where
bubblewrap runs; a spec with patches is refused, exit 2, where it can't) or
``none`` (the explicit opt-out, recorded in the manifest and the report).
Whether bubblewrap runs here is probed once per process and binary (the
binary found on ``PATH``, or ``$INFERLOOM_BWRAP``): present, and a sandboxed
``true`` succeeds (containers may forbid the namespaces it needs).
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from inferloom.errors import InferloomError

__all__ = ["ENV_BINARY", "MODES", "SECRET_PATHS", "Sandbox", "SandboxUnavailable", "bwrap_binary", "probe",
           "required", "resolve", "start_failure"]

ENV_BINARY = "INFERLOOM_BWRAP"  # the bubblewrap binary to use (default: bwrap on PATH)
MODES = ("bwrap", "none")
# credentials under $HOME a sandboxed command never sees (directories become empty, files /dev/null)
SECRET_PATHS = (".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".netrc", ".git-credentials", ".pypirc",
                ".config/gcloud", ".config/gh")
GPU_DEVICES = ("/dev/nvidia*", "/dev/dri", "/dev/kfd")
INSTALL = "apt-get install bubblewrap"
_PROBE_TIMEOUT_S = 30.0


class SandboxUnavailable(InferloomError, RuntimeError):
    """Patches would run, and bubblewrap can't run here (exit 2: install it or opt out)."""


def bwrap_binary() -> str | None:
    """The bubblewrap binary: ``$INFERLOOM_BWRAP`` when set, else ``bwrap`` on PATH (None: not found)."""
    override = os.environ.get(ENV_BINARY)
    if override:
        return override
    return shutil.which("bwrap")


@dataclass(frozen=True)
class Sandbox:
    """A working bubblewrap binary and how it wraps a command (module docstring)."""

    binary: str
    version: str = ""

    def wrap(self, cmd: Sequence[str], *, cwd: str | Path, writable: Iterable[str | Path] = (),
             network: bool = False) -> list[str]:
        """``cmd`` as a bubblewrap command line: it starts in ``cwd`` and may
        write only ``writable`` (existing directories), its private ``/tmp``
        and ``/dev``; ``network``: share the host's network (a Specialist that
        calls a remote model; the filesystem stays read-only)."""
        args = [self.binary, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc",
                "--unshare-uts", "--unshare-cgroup-try", "--cap-drop", "ALL"]
        if not network:
            args.append("--unshare-net")
        args += ["--ro-bind", "/", "/", "--dev", "/dev"]
        for pattern in GPU_DEVICES:
            for dev in sorted(glob.glob(pattern)):
                args += ["--dev-bind-try", dev, dev]
        args += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--tmpfs", "/tmp"]
        if Path("/var/tmp").is_dir() and not Path("/var/tmp").is_symlink():
            args += ["--tmpfs", "/var/tmp"]
        if not network and Path("/run").is_dir() and not Path("/run").is_symlink():
            args += ["--tmpfs", "/run"]
        args += _hide_secrets()
        for p in _needed_under_hidden(cmd):  # e.g. a virtualenv under /tmp: visible again, read-only
            args += ["--ro-bind", p, p]
        for w in writable:
            p = os.path.realpath(w)
            args += ["--bind", p, p]
        args += ["--chdir", os.path.realpath(cwd), "--setenv", "TMPDIR", "/tmp", "--", *cmd]
        return args

    def record(self, network: bool = False) -> dict[str, Any]:
        """What the manifest and the ledger say about it."""
        return {"mode": "bwrap", "binary": self.binary, "version": self.version,
                "isolation": "root read-only; writable: the run's tree, its result directory, a private /tmp; "
                             "no network; own PID namespace; no capabilities; dies with inferloom",
                "specialist_network": network}


#: the directory holding this inferloom package (a clone's ``src/`` for an editable install)
_OWN_SOURCE = str(Path(__file__).resolve().parents[1])

#: Host directories the sandbox replaces with empty private ones.
HIDDEN = ("/tmp", "/var/tmp", "/run")


def _needed_under_hidden(cmd: Sequence[str]) -> list[str]:
    """Host paths the command needs to start that lie under a directory the
    sandbox hides (:data:`HIDDEN`): this Python's prefixes (a virtualenv
    created under /tmp), the program ``cmd[0]`` names (through ``PATH``), the
    ``PYTHONPATH`` entries, the directory inferloom itself is imported from (an editable install in a
    clone under /tmp) and any existing absolute path in ``cmd``. Bound
    back read-only: hiding them would only break the command."""
    found: list[str] = []
    prog = shutil.which(cmd[0]) if cmd else None
    cands = [sys.prefix, sys.base_prefix, sys.exec_prefix, *(os.environ.get("PYTHONPATH") or "").split(os.pathsep),
             _OWN_SOURCE]  # inferloom's own source: an editable install's lies outside sys.prefix
    if prog:
        cands += [os.path.dirname(os.path.abspath(prog)), os.path.dirname(os.path.realpath(prog))]
    cands += [a for a in cmd if os.path.isabs(a)]
    for c in cands:
        if not c or not os.path.exists(c):
            continue
        p = os.path.realpath(c)
        if os.path.isfile(p):
            p = os.path.dirname(p)
        if any(p == h or p.startswith(h + "/") for h in HIDDEN) and p not in HIDDEN and p not in found:
            found.append(p)
    return sorted(found)


def _hide_secrets() -> list[str]:
    home = os.environ.get("HOME") or ""
    if not home or os.path.realpath(home) == "/":
        return []
    out: list[str] = []
    for rel in SECRET_PATHS:
        p = os.path.join(home, rel)
        if os.path.islink(p):
            continue  # a link: hiding its target's place is not ours to decide; its target stays read-only
        if os.path.isdir(p):
            out += ["--tmpfs", p]
        elif os.path.isfile(p):
            out += ["--ro-bind", "/dev/null", p]
    return out


@functools.lru_cache(maxsize=None)
def probe(binary: str) -> tuple[str | None, str]:
    """``(why it can't run or None, its version)``: ``binary`` runs a sandboxed
    ``true`` with the flags :meth:`Sandbox.wrap` uses. Cached per binary."""
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        return f"{binary} not found or not executable", ""
    try:
        ver = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S)
        res = subprocess.run(Sandbox(binary).wrap(["true"], cwd="/"), capture_output=True, text=True,
                             timeout=_PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{binary} could not run: {type(exc).__name__}: {exc}", ""
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or [f"exit code {res.returncode}"])[-1][:200]
        return f"a sandboxed `true` failed: {tail}", ""
    return None, ver.stdout.strip()


def resolve(mode: str, *, patches: bool, network: bool = False) -> tuple[Sandbox | None, dict[str, Any]]:
    """The sandbox a custom workload's commands run in, and its record (for
    the manifest and the ledger). ``mode``: the spec's ``custom.sandbox``;
    ``patches``: whether patches can run (a patch directory, a Specialist
    command or a patch source given to the coordinator). Raises
    :class:`SandboxUnavailable` when patches would run, the mode is ``bwrap``
    and bubblewrap can't run here."""
    if mode not in MODES:
        raise SandboxUnavailable(f"custom.sandbox: got {mode!r}, expected one of {', '.join(MODES)}")
    if mode == "none":
        return None, {"mode": "none", "patches": patches,
                      "reason": "custom.sandbox: none in the spec (the user opted out of the sandbox)"}
    binary = bwrap_binary()
    why, version = probe(binary) if binary else ("bwrap is not on PATH", "")
    if why is None and binary:
        sb = Sandbox(binary, version)
        return sb, sb.record(network)
    if patches:
        raise SandboxUnavailable(
            f"custom workload with patches: bubblewrap can't run here ({why}); a patch is code that will run, so "
            f"inferloom runs patches only in its sandbox: install it (`{INSTALL}`, or `make test` as root) or, to "
            "run them unsandboxed at your own risk, set `custom.sandbox: none` in the spec (docs/security.md)")
    return None, {"mode": "none", "patches": False,
                  "reason": f"bubblewrap can't run here ({why}); no patches in this spec: only your own code runs"}


def required(what: str) -> Sandbox:
    """A sandbox that runs here, for code someone else wrote (``what`` says which: a handed-over session's
    written kernels, its custom entrypoint); :class:`SandboxUnavailable` saying why and what to do otherwise.
    No opt-out: ``custom.sandbox: none`` in a handed-over manifest is the author's choice, not the user's."""
    binary = bwrap_binary()
    why, version = probe(binary) if binary else ("bwrap is not on PATH", "")
    if why is None and binary:
        return Sandbox(binary, version)
    raise SandboxUnavailable(f"{what}: inferloom runs that only in its sandbox, and bubblewrap can't run here "
                             f"({why}); install it (`{INSTALL}`) and run the command again")


def start_failure(sandbox: Sandbox | None, rc: int | None, err: str | bytes | None) -> str | None:
    """bubblewrap's own message when it could not start the wrapped command
    (e.g. ``bwrap: execvp prog: No such file or directory``), else None."""
    if sandbox is None or rc != 1 or not err:
        return None
    text = err.decode("utf-8", "replace") if isinstance(err, bytes) else err
    last = (text.strip().splitlines() or [""])[-1]
    return last if last.startswith("bwrap: ") else None
