"""The report's Deploy section: the final stack as a user runs it.

:func:`session_deploy` computes it from the session's files alone (the manifest's spec and
adapter record, the final stack of the ledger's close entry or ``state.json``, the ledger) through the framework's ``deploy``
target (:mod:`inferloom.workloads.deploy`); :func:`deploy_lines` renders it for ``report.md``,
:func:`deploy_html` for ``report.html`` and :func:`deploy_markdown` is ``inferloom export``'s
``deploy.md``. A session whose files can't say (no manifest, no final stack) has no section.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inferloom.frameworks import described
from inferloom.report.fmt import esc
from inferloom.session import ledger as L
from inferloom.session.manifest import ManifestError, manifest_spec
from inferloom.workloads.registry import deploy

__all__ = ["session_deploy", "deploy_lines", "deploy_html", "deploy_markdown"]


def session_deploy(directory: str | Path, entries: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """The Deploy dict of the session in ``directory``, or None (no manifest, no final stack, no target);
    the final stack is the ledger's close entry's (else ``state.json``'s)."""
    d = Path(directory)
    try:
        manifest = json.loads((d / "manifest.json").read_text())
        # the report renders from the ledger alone: state.json only fills in a close entry's absence
        state = json.loads((d / "state.json").read_text()) if (d / "state.json").is_file() else {}
        spec = _spec(d, manifest)
        entries = L.read_entries(d) if entries is None else entries
    except Exception:  # noqa: BLE001 - a session that can't say has no Deploy section
        return None
    fw = described(spec.framework)
    close = next((e for e in reversed(entries) if e.get("kind") == L.CLOSE), None) or {}
    # the close entry's final stack (written before state.json is saved at CLOSE), else state.json's
    final = close.get("final_config") if isinstance(close.get("final_config"), dict) else state.get("stack")
    stock = close.get("stock_config") if isinstance(close.get("stock_config"), dict) else state.get("stock_config")
    if fw is None or not isinstance(final, dict):
        return None
    try:
        dep = deploy(fw, spec, final, manifest, entries)
    except Exception as exc:  # noqa: BLE001 - said in the section, the rest of the report stands
        return {"kind": "absent", "intro": [f"Not computed: {type(exc).__name__}: {exc}"], "code": "", "notes": []}
    if dep is not None:
        dep["changed"] = {k: v for k, v in final.items() if (stock or {}).get(k) != v}
    return dep


def _spec(d: Path, manifest: dict[str, Any]) -> Any:
    """The session's spec; a session read on another machine (its model directory not here) keeps the model
    it names as recorded, checked as a preset would be (the command names what ran, wherever it ran)."""
    try:
        return manifest_spec(d, manifest)
    except ManifestError:
        raw = manifest.get("spec") or {}
        if not isinstance(raw.get("model"), str):
            raise
        spec = manifest_spec(d, {**manifest, "spec": {**raw, "model": "llama-tiny"}})
        return spec.model_copy(update={"model": raw["model"]})


def _changed(dep: dict[str, Any]) -> str:
    ch = dep.get("changed") or {}
    return ("Changed from stock: " + ", ".join(f"`{k}={v}`" for k, v in ch.items()) + "."
            if ch else "The final stack is stock: no knob differs from it.")


def deploy_lines(dep: dict[str, Any] | None) -> list[str]:
    """``report.md``'s ``## Deploy`` section (empty for None)."""
    if not dep:
        return []
    lines = ["", "## Deploy", "", *dep.get("intro", [])]
    if dep.get("code"):
        lines += ["", f"```{dep.get('lang', '')}", dep["code"], "```"]
    lines += ["", f"- {_changed(dep)}"] + [f"- {n}" for n in dep.get("notes", [])]
    return lines


def deploy_markdown(dep: dict[str, Any], session_id: str) -> str:
    """``deploy.md`` of ``inferloom export``."""
    return "\n".join([f"# Deploying session {session_id}'s final stack", *deploy_lines(dep)[3:]]) + "\n"


def deploy_html(dep: dict[str, Any] | None) -> str | None:
    """``report.html``'s Deploy section body (None: no section)."""
    if not dep:
        return None
    out = [f"<p>{esc(x)}</p>" for x in dep.get("intro", [])]
    if dep.get("code"):
        out.append(f"<pre><code>{esc(dep['code'])}</code></pre>")
    out.append(f'<p class="note">{esc(_changed(dep))}</p>')
    out += [f'<p class="note">{esc(n)}</p>' for n in dep.get("notes", [])]
    return "".join(out)
