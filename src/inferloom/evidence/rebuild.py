"""``inferloom verify SESSION_DIR --rebuild``: a fresh virtualenv from the session's pin ledger
(``manifest.json`` → ``pins``), then ``--remeasure`` with that virtualenv's python.

:func:`rebuild` does, printing a progress line before each long step:

1. **the virtualenv**: ``python -m venv DIR`` (``--venv DIR``, else a new temporary directory, kept and
   named in the output; a ``DIR`` that already is a virtualenv is reused: pip then installs only what
   differs). Its python is ``--python`` (default: the one running inferloom); a major.minor version other
   than the pinned one is refused (what to pass instead);
2. **the pinned packages**: every pin is checked first (:func:`inferloom.evidence.pin_check.check_pins`: a
   package name and a PEP 440 version, nothing pip could read as an option, a URL or a path; one refused
   pin and nothing is installed), then one ``pip install --no-deps --only-binary :all: NAME==VERSION ...``
   (wheels only: no package's build backend runs) of every package in the pin ledger except inferloom
   itself and pip (the virtualenv's own installer: compared, not installed). Where
   from: pip's configured index and find-links, plus each ``--find-links DIR``; ``--no-index`` (offline):
   no index, only the ``--find-links`` directories (and those pip's own configuration names). A pin pip
   can't satisfy is an error naming the package, its pinned version, where it came from and what to do.
   pip, and every python the rebuild runs, gets this environment less the secret-named variables
   (:func:`inferloom.redact.without_secrets`);
3. **inferloom itself**, from the session's recorded source: the commit in ``manifest.json``
   (``inferloom.git_revision``) exported from the running inferloom's git checkout (``git archive``) when
   the checkout has it and the session's tree was clean; else the current checkout, saying why (a
   ``-dirty`` revision: the uncommitted changes are gone; a commit the checkout lacks);
4. **the comparison**: the virtualenv's packages (:func:`inferloom.pins.packages`, run by its own
   python) against the pins: ``matched`` (same version and the same installed files: the hashes of pip's
   ``RECORD`` less its bookkeeping alike, :func:`inferloom.pins.files_sha256`), ``matched_version_only`` (a
   ledger from before that hash), ``same_version_other_files``, ``differed`` (another version),
   ``missing``, ``extra`` (not in the pins), and the python version.

The record (:func:`rebuild`'s return value) is also written to ``DIR/inferloom-rebuild.json``.
``only`` (library use: a test or a benchmark on a subset) installs only the pins with those names; the
rest are listed as ``not_installed``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import inferloom
from inferloom.errors import InferloomError
from inferloom.evidence.pin_check import check_pin, check_pins
from inferloom.session.manifest import read_manifest
from inferloom.virtualenvs import VenvError, create_venv, venv_env
from inferloom.virtualenvs import child_env as _child_env
from inferloom.virtualenvs import pip_install as _pip

__all__ = ["RebuildError", "rebuild", "requirements", "install_pins", "compare_pins", "inferloom_source",
           "record_remeasure", "summary_lines", "venv_env", "REBUILD_RECORD"]

REBUILD_RECORD = "inferloom-rebuild.json"
NOT_INSTALLED = ("inferloom", "pip")  # inferloom: from its source; pip: the virtualenv's own installer
_SHA = re.compile(r"^[0-9a-f]{40}$")
_UNSATISFIED = re.compile(r"(?:No matching distribution found for|Could not find a version that satisfies the "
                          r"requirement) ([A-Za-z0-9_.\-]+)(?:==([^\s)]+))?")

Progress = Callable[[str], None]


class RebuildError(InferloomError, ValueError):
    """The virtualenv can't be rebuilt from the pins (what, why, what to do): exit 2."""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(pins: Mapping[str, Any], only: Iterable[str] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """``(the pins to install, the names left out by ``only``)``: every pinned package but inferloom (installed
    from its source) and pip (the virtualenv's own installer: compared, not installed). Every pin is checked
    first (:func:`~inferloom.evidence.pin_check.check_pins`): a PinError lists all those refused."""
    pkgs = pins.get("packages")
    if not isinstance(pkgs, list) or not pkgs:
        raise RebuildError("manifest.json has no pin ledger (pins.packages): the session was started by an inferloom "
                           "from before pins; --rebuild needs them (use --remeasure in an environment you built)")
    check_pins(pkgs)
    keep = None if only is None else {_norm(n) for n in only}
    todo, left = [], []
    for p in pkgs:
        if not isinstance(p, dict) or not p.get("name") or not p.get("version"):
            continue
        n = _norm(str(p["name"]))
        if n in NOT_INSTALLED:
            continue
        if keep is None or n in keep:
            todo.append(p)
        else:
            left.append(str(p["name"]))
    return todo, left


def _python_version(python: str) -> str:
    try:
        out = subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, timeout=60, env=_child_env())
    except (OSError, subprocess.SubprocessError) as exc:
        raise RebuildError(f"--python {python}: can't run it ({exc}); pass the path of a python interpreter") from None
    if out.returncode != 0:
        raise RebuildError(f"--python {python}: it failed ({out.stderr.strip()[-300:]}); pass another interpreter")
    return out.stdout.strip()


def make_venv(venv: Path, python: str, pinned_python: str | None, progress: Progress) -> Path:
    """The virtualenv at ``venv`` (created, or reused when it is one); returns its python."""
    have = _python_version(python)
    if pinned_python and have.split(".")[:2] != pinned_python.split(".")[:2]:
        raise RebuildError(f"the session ran on Python {pinned_python}; {python} is Python {have}: compiled packages "
                           f"are built per Python version; pass --python with a Python "
                           f"{'.'.join(pinned_python.split('.')[:2])} interpreter")
    vpy = venv / "bin" / "python"
    if vpy.is_file():
        progress(f"reusing the virtualenv {venv} (pip installs only what differs from the pins)")
        return vpy
    if venv.exists() and any(venv.iterdir()):
        raise RebuildError(f"--venv {venv}: exists, is not empty and is not a virtualenv; name a new directory")
    progress(f"creating a virtualenv in {venv} with {python} (Python {have})")
    try:
        return create_venv(venv, python)
    except VenvError as exc:
        raise RebuildError(f"python -m venv {venv} failed: {exc}; on Debian and Ubuntu install the venv module "
                           "(apt-get install python3-venv)") from None


def _sources(find_links: Iterable[str | os.PathLike[str]], no_index: bool) -> list[str]:
    out = ["--no-index"] if no_index else []
    for f in find_links:
        path = Path(f).expanduser()
        if not path.is_dir():
            raise RebuildError(f"--find-links {f}: not a directory; give a directory of wheels")
        out += ["--find-links", str(path.resolve())]
    return out


def _requirement(pin: Mapping[str, Any]) -> str:
    """``NAME==VERSION`` of a pin, checked again here, where it becomes pip's argument."""
    check_pin(pin["name"], pin["version"])
    return f"{pin['name']}=={pin['version']}"


def install_pins(vpy: Path, todo: list[dict[str, Any]], *, find_links: Iterable[str | os.PathLike[str]] = (),
                 no_index: bool = False, progress: Progress = lambda _m: None) -> float:
    """``pip install --no-deps`` every pin in ``todo`` into the virtualenv of ``vpy``; the seconds it took.
    Wheels only (``--only-binary :all:``); every pin checked before pip runs (PinError: nothing installed).
    RebuildError naming the first pin pip can't satisfy."""
    if not todo:
        return 0.0
    check_pins(todo)
    src = _sources(find_links, no_index)
    biggest = ", ".join(f"{p['name']} {p['version']}" for p in todo if _norm(p["name"]) in ("torch", "vllm", "triton"))
    progress(f"installing {len(todo)} pinned package(s) with pip --no-deps"
             + (f" (including {biggest}: this can take minutes)" if biggest else "")
             + (" offline, from --find-links only" if no_index else " from pip's configured index and find-links"
                + (" and --find-links" if find_links else "")))
    t0 = time.perf_counter()
    rc, tail = _pip(vpy, [*src, "--no-deps", "--only-binary", ":all:", *(_requirement(p) for p in todo)], progress)
    if rc == 0:
        return time.perf_counter() - t0
    text = "\n".join(tail)
    m = _UNSATISFIED.search(text)
    if m:
        name = m.group(1)
        pin = next((p for p in todo if _norm(p["name"]) == _norm(name)), {"name": name, "version": m.group(2)})
        came = f" (the session's came from {ascii(str(pin['url']))[:200]})" if pin.get("url") else ""
        raise RebuildError(f"pin {pin['name']}=={pin['version']} can't be installed: pip found no such distribution"
                           f"{' offline' if no_index else ' on its index'}{came}; put its wheel in a directory and "
                           "pass --find-links DIR (or configure a pip index that has it), then run again; the "
                           "virtualenv is kept for the next try")
    last = next((x for x in reversed(tail) if x.startswith("ERROR")), tail[-1] if tail else "(no output)")
    raise RebuildError(f"pip could not install the pins (exit {rc}): {last[:400]}; see pip's message, fix it (a "
                       "--find-links DIR with the wheel, a reachable index), then run again")


def _source_root() -> Path | None:
    """The git checkout the running inferloom is imported from (None: installed from a wheel)."""
    root = Path(inferloom.__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / ".git").exists() else None


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=root, capture_output=True)


def inferloom_source(manifest: Mapping[str, Any], workdir: Path, mode: str = "auto") -> dict[str, Any]:
    """Where inferloom is installed from: ``{"kind": "pinned commit"|"current checkout", "path", "commit",
    "why"}`` (``mode``: ``auto`` = the pinned commit when possible, ``current`` = the current checkout)."""
    rev = str((manifest.get("inferloom") or {}).get("git_revision") or "unknown")
    root = _source_root()
    if root is None:
        raise RebuildError(f"the running inferloom ({inferloom.__file__}) is not a git checkout, so the session's "
                           f"commit {rev} can't be exported from it; run verify --rebuild from a clone of inferloom")
    head = _git(root, "rev-parse", "HEAD").stdout.decode().strip()
    dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no").stdout.strip())
    current = {"kind": "current checkout", "path": str(root), "commit": head + ("-dirty" if dirty else "")}
    if mode == "current":
        return _copy_checkout(root, workdir, {**current, "why": "--inferloom-source current"})
    if not _SHA.match(rev):
        why = (f"the session ran at {rev}: its uncommitted changes can't be rebuilt" if rev.endswith("-dirty")
               else f"the session recorded no commit ({rev})")
        return _copy_checkout(root, workdir, {**current, "why": why + "; installed the current checkout instead"})
    if _git(root, "cat-file", "-e", f"{rev}^{{commit}}").returncode != 0:
        return _copy_checkout(root, workdir, {**current, "why": f"the session's commit {rev[:12]} is not in {root} "
                                             "(fetch it to rebuild exactly); installed the current checkout instead"})
    dest = workdir / f"inferloom-{rev[:12]}"
    arch = _git(root, "archive", "--format=tar", rev)
    if arch.returncode != 0:
        raise RebuildError(f"git archive {rev[:12]} failed in {root}: {arch.stderr.decode()[-300:]}")
    dest.mkdir(parents=True)
    tar_path = workdir / "source.tar"
    tar_path.write_bytes(arch.stdout)
    with tarfile.open(tar_path) as tar:
        tar.extractall(dest, filter="data")
    tar_path.unlink()
    return {"kind": "pinned commit", "path": str(dest), "commit": rev,
            "why": f"the session's commit {rev[:12]}, exported from {root} (git archive)"}


def _copy_checkout(root: Path, workdir: Path, src: dict[str, Any]) -> dict[str, Any]:
    """The checkout's working tree (tracked and untracked files, not the ignored ones: no virtualenv, no
    build output) copied to ``workdir``: pip builds in the copy and writes nothing into the checkout."""
    dest = workdir / "inferloom-checkout"
    listed = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    for rel in sorted(set(x for x in listed.stdout.decode().split("\0") if x)):
        f = root / rel
        if f.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest / rel)
    return {**src, "copied_to": str(dest), "path": str(dest)}


def _venv_packages(vpy: Path) -> list[dict[str, Any]]:
    code = "import json; from inferloom.pins import packages; print(json.dumps(packages()))"
    res = subprocess.run([str(vpy), "-c", code], capture_output=True, text=True, timeout=600, cwd="/", env=_child_env())
    if res.returncode != 0:
        raise RebuildError(f"the rebuilt virtualenv's python can't import inferloom: {res.stderr.strip()[-400:]}; "
                           "a pin inferloom needs is missing or broken there")
    return json.loads(res.stdout)


def compare_pins(pins: Mapping[str, Any], got: list[dict[str, Any]], left_out: Iterable[str] = ()) -> dict[str, Any]:
    """The rebuilt packages ``got`` against the pin ledger (see the module docstring, step 4)."""
    have = {_norm(p["name"]): p for p in got}
    skip = {_norm(n) for n in left_out}
    out: dict[str, Any] = {"matched": [], "matched_version_only": [], "same_version_other_files": [], "differed": [], "missing": [],
                           "not_installed": sorted(left_out, key=_norm), "extra": []}
    pinned = set()
    for p in pins.get("packages") or []:
        n = _norm(p["name"])
        pinned.add(n)
        if n in skip or n == "inferloom":
            continue
        g = have.get(n)
        if g is None:
            out["missing"].append({"name": p["name"], "pinned": p["version"]})
        elif g["version"] != p["version"]:
            out["differed"].append({"name": p["name"], "pinned": p["version"], "rebuilt": g["version"]})
        elif not p.get("files_sha256"):  # a ledger from before files_sha256: the version is all it says
            out["matched_version_only"].append(f"{p['name']}=={p['version']}")
        elif p["files_sha256"] != g.get("files_sha256"):
            out["same_version_other_files"].append({"name": p["name"], "version": p["version"]})
        else:
            out["matched"].append(f"{p['name']}=={p['version']}")
    out["extra"] = sorted(g["name"] for n, g in have.items() if n not in pinned)
    return out


def rebuild(directory: str | Path, *, venv: str | Path | None = None, python: str | None = None,
            find_links: Iterable[str | os.PathLike[str]] = (), no_index: bool = False, source: str = "auto",
            only: Iterable[str] | None = None, progress: Progress = lambda _m: None) -> dict[str, Any]:
    """Build the virtualenv from the session's pins (see the module docstring); returns the record, with
    ``venv_python``: the interpreter to re-measure with."""
    d = Path(directory).absolute()
    manifest = read_manifest(d)
    pins = manifest.get("pins") or {}
    todo, left = requirements(pins, only)
    links = list(find_links)
    _sources(links, no_index)  # a bad --find-links: said before anything is built
    vdir = Path(venv).absolute() if venv else Path(tempfile.mkdtemp(prefix="inferloom-rebuild-"))
    t0 = time.perf_counter()
    pinned_py = (pins.get("python") or {}).get("version")
    vpy = make_venv(vdir, python or sys.executable, pinned_py, progress)
    t_venv = time.perf_counter() - t0
    t_pins = install_pins(vpy, todo, find_links=links, no_index=no_index, progress=progress)
    with tempfile.TemporaryDirectory(prefix="inferloom-rebuild-src-") as tmp:
        src = inferloom_source(manifest, Path(tmp), source)
        progress(f"installing inferloom from the {src['kind']} {src['commit'][:12]} ({src['why']})")
        t1 = time.perf_counter()
        has_setuptools = subprocess.run([str(vpy), "-c", "import setuptools"], capture_output=True,
                                        env=_child_env()).returncode == 0
        flags = ["--no-build-isolation"] if has_setuptools else []
        rc, tail = _pip(vpy, [*_sources(links, no_index), "--no-deps", "--force-reinstall", "--only-binary", ":all:",
                              *flags, src["path"]], progress)
        if rc != 0:
            raise RebuildError(f"installing inferloom from {src['path']} failed: {(tail or ['?'])[-1][:400]}; its build "
                               "needs setuptools (pinned with the session's packages, or from the index)")
        t_self = time.perf_counter() - t1
    progress("comparing the virtualenv's packages with the pin ledger")
    cmp = compare_pins(pins, _venv_packages(vpy), left)
    have_py = _python_version(str(vpy))
    record = {"venv": str(vdir), "venv_python": str(vpy), "python": {"pinned": pinned_py, "rebuilt": have_py,
                                                                       "matched": have_py == pinned_py},
              "inferloom_source": src, "sources": {"find_links": [str(Path(f).resolve()) for f in links],
                                                   "no_index": no_index},
              "pins": len(pins.get("packages") or []), "installed": len(todo), **cmp,
              "seconds": {"venv": t_venv, "pins": t_pins, "inferloom": t_self, "total": time.perf_counter() - t0}}
    (vdir / REBUILD_RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def summary_lines(r: Mapping[str, Any]) -> list[str]:
    """The record in a few lines, for the CLI."""
    py = r["python"]
    lines = [f"rebuild: virtualenv {r['venv']} ({r['seconds']['total']:.0f} s; record {r['venv']}/{REBUILD_RECORD})",
             f"rebuild: Python {py['rebuilt']} (pinned {py['pinned']}: {'same' if py['matched'] else 'DIFFERS'}); "
             f"inferloom from the {r['inferloom_source']['kind']} {r['inferloom_source']['commit'][:12]}: "
             f"{r['inferloom_source']['why']}",
             f"rebuild: {len(r['matched'])} of {r['pins']} pins matched exactly (version and installed files), "
             + (f"{len(r['matched_version_only'])} by version (the ledger has no file hashes), "
                if r["matched_version_only"] else "") +
             f"{len(r['same_version_other_files'])} same version with other files, {len(r['differed'])} differed, "
             f"{len(r['missing'])} missing, {len(r['not_installed'])} not installed, {len(r['extra'])} extra"]
    for p in r["differed"]:
        lines.append(f"rebuild: DIFFERS {p['name']}: pinned {p['pinned']}, rebuilt {p['rebuilt']}")
    for p in r["same_version_other_files"]:
        lines.append(f"rebuild: other files {p['name']} {p['version']} (its RECORD differs from the session's)")
    for p in r["missing"]:
        lines.append(f"rebuild: MISSING {p['name']} {p['pinned']}")
    if r["not_installed"]:
        lines.append(f"rebuild: not installed: {', '.join(r['not_installed'])}")
    return lines


def record_remeasure(record: dict[str, Any], result: Mapping[str, Any]) -> None:
    """Add the re-measurement made with the virtualenv's python to its record (``DIR/inferloom-rebuild.json``)."""
    record["remeasure"] = dict(result)
    (Path(record["venv"]) / REBUILD_RECORD).write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
