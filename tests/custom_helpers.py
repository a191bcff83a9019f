"""Helpers for the custom-workload tests: small git repositories and specs."""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

from inferloom.spec import WorkloadSpec

ROOT = Path(__file__).resolve().parents[1]
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}

# A tiny entrypoint: objective = SPEED (a knob), gate per GATE ("pass", "fail", "none", "bad"),
# plus failure modes for the adapter tests.
TINY_RUN = r'''
import json, os, sys, time
mode = os.environ.get("MODE", "ok")
if mode == "exit":
    sys.stderr.write("boom: something broke\n"); sys.exit(3)
if mode == "sleep":
    time.sleep(30)
if mode == "noresult":
    sys.exit(0)
res = {"objective": {"value": float(os.environ.get("SPEED", "100")), "unit": "items/s"}}
if mode == "badobj":
    res["objective"]["value"] = -1
gate = os.environ.get("GATE", "pass")
if gate == "pass":
    res["quality_gate"] = {"passed": True, "checks": {"max_err": 0.0}}
elif gate == "fail":
    res["quality_gate"] = {"passed": False, "checks": {"max_err": 1.0}}
elif gate == "bad":
    res["quality_gate"] = "looks fine to me"
with open(os.environ["INFERLOOM_RESULT"], "w") as f:
    f.write("{not json" if mode == "badjson" else json.dumps(res))
'''


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=GIT_ENV).stdout


def git_repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git("init", "--quiet", "--initial-branch=main", cwd=path)
    git("add", "-A", cwd=path)
    git("commit", "--quiet", "-m", "init", cwd=path)
    return path


def tiny_custom_spec(tmp: Path, **custom: Any) -> WorkloadSpec:
    repo = tmp / "repo" if (tmp / "repo").exists() else git_repo(tmp / "repo", {"run.py": TINY_RUN})
    knobs = [
        {"name": "speed", "kind": "choice", "choices": ["100", "200"], "default": "100", "env": "SPEED",
         "description": "objective value"},
        {"name": "gate", "kind": "choice", "choices": ["pass", "fail", "none", "bad"], "default": "pass",
         "env": "GATE", "description": "what the gate says"},
        {"name": "mode", "kind": "choice", "choices": ["ok", "exit", "sleep", "noresult", "badobj", "badjson"],
         "default": "ok", "env": "MODE", "description": "failure modes"},
    ]
    c = {"repo": str(repo), "entrypoint": [sys.executable, "run.py"], "entrypoint_files": ["run.py"],
         "knobs": knobs, "timeout_s": 3, **custom}
    return WorkloadSpec.model_validate({"framework": "custom", "device": "cpu", "custom": c})


def load_make_demo() -> Any:
    spec = importlib.util.spec_from_file_location("make_demo", ROOT / "examples" / "custom" / "make_demo.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def checksums(root: Path, skip: tuple[Path, ...] = ()) -> dict[str, str]:
    """sha256 of every file under ``root`` (paths relative), except under ``skip``."""
    out = {}
    for p in sorted(root.rglob("*")):
        if any(p == s or s in p.parents for s in skip) or not p.is_file() or p.is_symlink():
            continue
        out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out
