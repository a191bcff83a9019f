"""Set up the custom-workload demo: a git checkout of ``workload/`` and a spec.

    python examples/custom/make_demo.py runs/custom-demo
    .venv/bin/inferloom optimize runs/custom-demo/custom.yaml --out runs/custom-demo/session

``DEST/checkout`` becomes a git repository holding the workload (one commit);
``DEST/custom.yaml`` points inferloom at it, at the entrypoint ``bench.py``,
at the candidate patches in ``examples/custom/patches`` and at the files no
patch may touch. Options: ``--points N`` / ``--repeats N`` (problem size, pinned).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent


def make_demo(dest: str | Path, *, points: int = 800, repeats: int = 1, python: str = sys.executable,
              patches_dir: str | Path | None = None, min_pairs: int = 5, max_pairs: int = 9) -> Path:
    """Create DEST/checkout (a git repo) and DEST/custom.yaml; return the spec's path."""
    dest = Path(dest).resolve()
    repo = dest / "checkout"
    if repo.exists():
        raise SystemExit(f"{repo} exists already; choose another destination")
    shutil.copytree(HERE / "workload", repo, ignore=shutil.ignore_patterns("__pycache__"))
    env = {"GIT_AUTHOR_NAME": "demo", "GIT_AUTHOR_EMAIL": "demo@example.com", "GIT_COMMITTER_NAME": "demo",
           "GIT_COMMITTER_EMAIL": "demo@example.com", "PATH": "/usr/bin:/bin"}
    for cmd in (["git", "init", "--quiet", "--initial-branch=main"], ["git", "add", "-A"],
                ["git", "commit", "--quiet", "-m", "kNN workload"]):
        subprocess.run(cmd, cwd=repo, check=True, env=env)
    spec = {
        "framework": "custom",
        "device": "cpu",
        "seed": 0,
        "protocol": {"min_pairs": min_pairs, "max_pairs": max_pairs, "pair_step": 2, "bootstrap_resamples": 999},
        "pinned": {"points": points, "repeats": repeats},
        "custom": {
            "repo": str(repo),
            "entrypoint": [python, "bench.py"],
            "entrypoint_files": ["bench.py"],
            "objective": "queries_per_s",
            "higher_is_better": True,
            "timeout_s": 120,
            "knobs": [
                {"name": "select", "kind": "choice", "choices": ["sort", "partition"], "default": "sort",
                 "env": "KNN_SELECT", "description": "neighbour selection: a full sort or a partial partition"},
                {"name": "points", "kind": "int", "low": 50, "high": 100000, "default": 800, "env": "KNN_POINTS",
                 "description": "problem size (pinned: it defines the workload)"},
                {"name": "repeats", "kind": "int", "low": 1, "high": 100, "default": 1, "env": "KNN_REPEATS",
                 "description": "kernel calls timed per run (pinned)"},
            ],
            "patches": {
                "dir": str(Path(patches_dir).resolve() if patches_dir else HERE / "patches"),
                "allowlist": ["kernel.py", "*.md"],
                "quality_gate": ["gate.py"],
                "benchmark_inputs": ["inputs.py"],
                "forbidden_patterns": [r"\bsubprocess\b", r"os\.system"],
            },
        },
    }
    path = dest / "custom.yaml"
    path.write_text("# written by examples/custom/make_demo.py (see README: custom workloads)\n"
                    + yaml.safe_dump(spec, sort_keys=False))
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dest")
    p.add_argument("--points", type=int, default=800)
    p.add_argument("--repeats", type=int, default=1)
    a = p.parse_args()
    spec = make_demo(a.dest, points=a.points, repeats=a.repeats)
    print(f"checkout: {spec.parent / 'checkout'}\nspec: {spec}\nnext: .venv/bin/inferloom optimize {spec} "
          f"--budget-minutes 10 --max-trials 6 --no-kb --out {spec.parent / 'session'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
