"""``serving.engine_patches``: a directory of engine diffs the user supplies (e.g. upstream pull requests saved
as ``.patch``), each tried as a candidate against the server's installed package through a copy-on-write
overlay (``workloads/vllm_source_overlay.py``; docs/kernels.md, "Engine source patches").

What validation checks (one line, exit 2, before a session directory exists), with what only a candidate's
gates can know left to them:

* the directory exists and holds at least one ``.patch`` / ``.diff`` file;
* every other file is a patch's metadata sidecar (``NAME.json`` / ``NAME.yaml`` / ``NAME.yml`` beside
  ``NAME.patch``, as ``custom.patches.dir`` reads them) or a ``README*``; anything else is refused (a
  stray file is a patch the user meant and misnamed, or a directory meant for something else);
* every patch is UTF-8 text with at least one file section (``--- a/...`` / ``+++ b/...``), and at least one
  of the paths it names is in the engine's package (``vllm/...``, as in vLLM's repository): a patch wholly
  outside it can never apply to the installed package.

Left to the candidate's gates in the session, each refusal with its rule: a hunk that does not parse
(``malformed_diff``), a patch that also touches files outside the package (``outside_allowlist``: an
upstream PR's ``csrc/`` or ``tests/``, which the installed package does not have), the critic's sign-off
(``no_hypothesis``, ``diff_outside_hypothesis``), and ``does_not_apply`` on the installed version.
Imports nothing from inferloom but the foundation (spec/ sits below the patch parser).
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["PATCH_SUFFIXES", "SIDECAR_SUFFIXES", "check_engine_patches", "patch_paths", "ENGINE_PACKAGE"]

PATCH_SUFFIXES = (".patch", ".diff")
SIDECAR_SUFFIXES = (".json", ".yaml", ".yml")
ENGINE_PACKAGE = "vllm"
_FILE_LINE = re.compile(r"^(?:---|\+\+\+) (?:[ab]/)?(\S+)", re.M)


def patch_paths(text: str) -> list[str]:
    """The paths a diff's ``---`` / ``+++`` lines name (``/dev/null`` left out), in order, once each."""
    seen: dict[str, None] = {}
    for p in _FILE_LINE.findall(text):
        if p != "/dev/null":
            seen.setdefault(p, None)
    return list(seen)


def check_engine_patches(value: str | None, package: str = ENGINE_PACKAGE) -> str | None:
    """``value`` unchanged, or ValueError naming the first problem (see the module docstring)."""
    if value is None:
        return None
    d = Path(value)
    if not d.exists():
        raise ValueError(f"{value}: no such directory; give the directory that holds the engine's .patch files")
    if not d.is_dir():
        raise ValueError(f"{value}: not a directory; give the directory that holds the engine's .patch files")
    files = sorted(p for p in d.iterdir() if not p.name.startswith("."))
    patches = [p for p in files if p.suffix in PATCH_SUFFIXES and p.is_file()]
    if not patches:
        raise ValueError(f"{value}: holds no .patch or .diff file; put the engine diffs there (git diff / "
                         "format-patch output)")
    stems = {p.stem for p in patches}
    for p in files:
        if p in patches or (p.suffix in SIDECAR_SUFFIXES and p.stem in stems) or p.name.upper().startswith("README"):
            continue
        raise ValueError(f"{p}: not a patch (.patch, .diff) nor a patch's sidecar (NAME.json / NAME.yaml beside "
                         "NAME.patch); move it out of serving.engine_patches")
    for p in patches:
        try:
            text = p.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{p}: not a readable UTF-8 diff ({type(exc).__name__}); save the patch as text") from None
        paths = patch_paths(text)
        if not paths:
            raise ValueError(f"{p}: no file section (--- a/PATH, +++ b/PATH): not a unified diff")
        if not any(x == package or x.startswith(package + "/") for x in paths):
            raise ValueError(f"{p}: touches no file of the {package} package ({', '.join(paths[:3])}); an engine "
                             f"patch's paths are as in {package}'s repository ({package}/...)")
    return value
