"""The enablement ladder's source rungs for a server engine: what rungs 3-5 try, as knobs of the stock configuration.

A server whose stock fails to start climbs (``phases/enablement.py``): rung 3, an in-tree patch of the user's
``serving.engine_patches`` directory; rung 4, an alternate engine from ``serving.wheelhouse`` in a virtualenv
of its own (``engine_env``); rung 5, an upstream diff of the same directory. Each is a *configuration*: two
knobs of phase ``ENABLEMENT`` (proposed by nothing else; the allowlist refuses them in FRAMEWORK and KERNEL):

* ``enablement_patch`` (:data:`PATCH_KNOB`): a patch file's name; its server starts with the patch applied to
  a copy-on-write overlay of the installed engine package (``vllm_source_overlay.build_source_overlay``: the
  patch pipeline's parse and policy gates, ``git apply``; the installed environment is only read), put first on
  its ``PYTHONPATH``;
* ``enablement_env`` (:data:`ENV_KNOB`): a wheelhouse candidate's name; its server runs with that candidate's
  virtualenv's python.

The rung that recovers stock becomes the stock configuration: PRELUDE measures it, every trial builds on it,
its ``server_start`` entries record the overlay (``overlays``, with ``knob``) and the environment
(``engine_env``: python, wheels' sha256, pins); ``verify --remeasure`` pins it (the recovered stock is part of
stock) and ``deploy`` starts the same overlay / python.

Which patch is which rung: a patch is an *upstream diff* (rung 5) when its file name starts with ``upstream``
(``upstream-vllm-pr-12345.patch``) or its header (the text before the first ``diff --git`` / ``---`` line) has
a line ``Origin: upstream`` (DEP-3, Debian's patch header: ``Origin: upstream, https://github.com/...``);
every other ``.patch`` / ``.diff`` is an in-tree patch (rung 3). Each rung tries its patches in file-name order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from inferloom.patches.parse import PatchRefusal
from inferloom.workloads.base import AdapterError, Knob
from inferloom.workloads.engine_env import EngineEnvError, build_env, wheel_candidates
from inferloom.workloads.vllm_plugins import EngineOverlayError, OverlayDir, last_recorded, overlay_env
from inferloom.workloads.vllm_source_overlay import build_source_overlay, engine_patch_policy, installed_package

__all__ = ["PATCH_KNOB", "ENV_KNOB", "RUNG_NAMES", "patch_rung", "engine_patches", "EngineLadder", "ENVS_DIR",
           "recorded_stack", "check_session_stack"]

PATCH_KNOB = "enablement_patch"
ENV_KNOB = "enablement_env"
ENVS_DIR = "envs"  # under the adapter's log directory (a session's servers/), beside overlays/
RUNG_NAMES = {3: "in-tree patch", 4: "alternate environment", 5: "upstream diff"}
_ORIGIN = re.compile(r"^Origin:\s*upstream\b", re.I | re.M)


def patch_rung(path: Path) -> int:
    """5 for an upstream diff, 3 for an in-tree patch (the module docstring's rule)."""
    if path.name.lower().startswith("upstream"):
        return 5
    text = path.read_text(errors="replace")
    head = re.split(r"^(?:diff --git |--- )", text, maxsplit=1, flags=re.M)[0]
    return 5 if _ORIGIN.search(head) else 3


def engine_patches(directory: str | Path) -> dict[str, int]:
    """File name -> rung of every ``.patch`` / ``.diff`` in ``directory``, in file-name order."""
    files = sorted(p for p in Path(directory).iterdir() if p.is_file() and p.name.endswith((".patch", ".diff")))
    return {p.name: patch_rung(p) for p in files}


class EngineLadder:
    """Rungs 3-5 of one server adapter: its knobs, candidates, and what a configuration's server starts with."""

    def __init__(self, spec: Any, package: str | None, distributions: tuple[str, ...], root: Callable[[], Path],
                 progress: Callable[[str], None]) -> None:
        s = spec.serving
        self.python, self.patch_dir, self.wheelhouse = s.python, s.engine_patches, s.wheelhouse
        self.package, self.distributions, self._root, self.progress = package, distributions, root, progress
        self.patches = engine_patches(self.patch_dir) if self.patch_dir and package else {}
        self.wheels = wheel_candidates(self.wheelhouse, distributions) if self.wheelhouse else []
        self._pkg: Path | None = None
        self._envs: dict[str, dict[str, Any]] = {}

    def knobs(self) -> list[Knob]:
        """The two knobs, each only when its directory is given."""
        out = []
        if self.patches:
            out.append(Knob(PATCH_KNOB, "choice", "none", "ENABLEMENT rungs 3 / 5: an engine patch of serving."
                            "engine_patches applied through a copy-on-write overlay of the installed package",
                            choices=("none", *self.patches), changes_numerics=True, phase="ENABLEMENT"))
        if self.wheels:
            out.append(Knob(ENV_KNOB, "choice", "none", "ENABLEMENT rung 4: the server started by the python of a "
                            "virtualenv holding serving.wheelhouse's wheels over the server's environment",
                            choices=("none", *(w["name"] for w in self.wheels)), changes_numerics=True,
                            phase="ENABLEMENT"))
        return out

    def candidates(self, rung: int) -> list[dict[str, Any]]:
        """Rung ``rung``'s candidates: ``{"name", "change", "what"}``."""
        if rung == 4:
            return [{"name": w["name"], "change": {ENV_KNOB: w["name"]},
                     "what": f"{w['name']}: {len(w['wheels'])} wheel(s) of {self.wheelhouse} in a virtualenv of their own"}
                    for w in self.wheels]
        return [{"name": n, "change": {PATCH_KNOB: n}, "what": f"{RUNG_NAMES[rung]} {Path(str(self.patch_dir)) / n}"}
                for n, r in self.patches.items() if r == rung]

    def why_none(self, rung: int) -> str:
        """Why rung ``rung`` has nothing to try."""
        if rung == 4:
            return "no serving.wheelhouse given" if not self.wheelhouse else "the wheelhouse holds no candidate"
        if not self.package:
            return "the engine has no package the source overlay can patch"
        if not self.patch_dir:
            return "no serving.engine_patches directory given"
        return f"{self.patch_dir} holds no {'upstream diff' if rung == 5 else 'in-tree patch'}"

    # ------------------------------------------------------------ a server's stack
    def overlays(self, cfg: Mapping[str, Any]) -> tuple[OverlayDir, ...]:
        """The source overlay ``cfg``'s patch knob names (built under ``<root>/overlays``); () for none.
        AdapterError (kind ``patch_refused``, the rule named) when a gate refuses the patch."""
        name = str(cfg.get(PATCH_KNOB, "none"))
        if name == "none":
            return ()
        path = Path(str(self.patch_dir)) / name
        try:
            data = path.read_bytes()
            if self._pkg is None:
                self._pkg = installed_package(self.python, str(self.package))
            ov = build_source_overlay(self._root() / "overlays", self._pkg, data, engine_patch_policy(str(self.package)))
        except PatchRefusal as exc:
            raise AdapterError(f"engine patch {path}: refused ({exc.rule}): {exc.why}", kind="patch_refused") from None
        except (OSError, EngineOverlayError) as exc:
            raise AdapterError(f"engine patch {path}: {exc}", kind="patch_refused") from None
        info = {**ov.info, "knob": {PATCH_KNOB: name}, "patch_file": str(path),
                "patch_file_sha256": hashlib.sha256(data).hexdigest()}
        return (dataclasses.replace(ov, info=info),)

    def env(self, cfg: Mapping[str, Any]) -> dict[str, Any] | None:
        """The rung-4 virtualenv ``cfg``'s env knob names (made once, under ``<root>/envs``), or None.
        AdapterError (kind ``engine_env``) when it can't be made."""
        name = str(cfg.get(ENV_KNOB, "none"))
        if name == "none":
            return None
        if name not in self._envs:
            cand = next((w for w in self.wheels if w["name"] == name), None)
            if cand is None:
                raise AdapterError(f"{ENV_KNOB}={name}: no such candidate in {self.wheelhouse}", kind="engine_env")
            try:
                self._envs[name] = build_env(self._root() / ENVS_DIR, cand, str(self.wheelhouse), self.python,
                                             self.progress)
            except EngineEnvError as exc:
                raise AdapterError(str(exc), kind="engine_env") from None
        return self._envs[name]

    def launch(self, cfg: Mapping[str, Any], argv: list[str], env: dict[str, str], origin: dict[str, Any],
               overlays: bool = True) -> tuple[list[str], dict[str, str], dict[str, Any]]:
        """The launch ``(argv, env, origin)`` of ``cfg`` on its rung's stack: a rung-4 virtualenv's python in place of
        ``serving.python``; with ``overlays`` (an engine whose launch does not take them itself, unlike vLLM's) the
        rung-3/5 source overlay first on ``PYTHONPATH``; both recorded in ``origin`` (the server start's record)."""
        rec = self.env(cfg)
        if rec is not None:
            argv = [rec["python"], *argv[1:]]
            origin["engine_env"] = {k: rec[k] for k in ("name", "python", "path", "digest", "wheels", "pins")}
        ovs = self.overlays(cfg) if overlays else ()
        if ovs:
            env = {**env, **overlay_env(ovs, env)}
            origin["overlays"] = [*origin.get("overlays", []), *(o.to_dict() for o in ovs)]
        return argv, env, origin

    def stack(self, cfg: Mapping[str, Any]) -> dict[str, Any]:
        """For the ledger: the overlay (patch, digest, patched files) and the environment (python, wheels, pins)
        a server of ``cfg`` starts with; {} for none."""
        out: dict[str, Any] = {}
        for ov in self.overlays(cfg):
            out["overlay"] = {"path": str(ov.path), "digest": ov.digest, "patch_file": ov.info["patch_file"],
                              "patch_file_sha256": ov.info["patch_file_sha256"], "patched": sorted(ov.files)}
        env = self.env(cfg)
        if env is not None:
            out["env"] = env
        return out


def recorded_stack(cfg: Mapping[str, Any], entries: Iterable[Mapping[str, Any]]) -> tuple[str | None, list[OverlayDir]]:
    """``(python, source overlays)`` the session's server starts recorded for ``cfg``'s enablement knobs (the last
    start that had them): what ``deploy`` starts the final stack with. ``(None, [])`` for none."""
    patch, env = str(cfg.get(PATCH_KNOB, "none")), str(cfg.get(ENV_KNOB, "none"))
    starts = [e for e in entries if e.get("kind") == "server_start"]
    python = None
    for e in starts:
        rec_env = e.get("engine_env") or {}
        if env != "none" and rec_env.get("name") == env:
            python = str(rec_env["python"])
    o = last_recorded(starts, "source", PATCH_KNOB, patch) if patch != "none" else None
    return python, ([] if o is None else
                    [OverlayDir("source", Path(str(o["path"])), str(o["digest"]), dict(o.get("files") or {}))])


def check_session_stack(changes: Mapping[str, Any], entries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``verify --remeasure``: the patch file and the wheels the recovered stock names are those the session ran
    (their sha256 against its ENABLEMENT record); EngineOverlayError naming the file that changed."""
    entries = list(entries)
    rungs = [e for e in entries if e.get("kind") == "enablement_rung" and e.get("stack") and
             all(e.get("change", {}).get(k) == v for k, v in changes.items() if k in (PATCH_KNOB, ENV_KNOB))]
    checked: list[dict[str, Any]] = []
    for e in rungs[-1:]:
        ov, env = e["stack"].get("overlay"), e["stack"].get("env")
        files = ([(ov["patch_file"], ov["patch_file_sha256"])] if ov else []) + \
            ([(str(Path(env["wheelhouse"]) / n), sha) for n, sha in env["wheels"].items()] if env else [])
        for path, sha in files:
            try:
                got = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            except OSError:
                got = "missing"
            if got != sha:
                raise EngineOverlayError(f"{path}: the session's recovered stock ran it with sha256 {sha[:12]}, it is "
                                         f"now {got[:12]}; restore the file the session used (or start a new session)")
            checked.append({"file": path, "sha256": sha})
    return checked
