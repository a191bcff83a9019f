"""``inferloom export SESSION_DIR``: the review bundle. inferloom never
promotes anything itself; a person reviews and applies this.

Writes into OUT (default ``SESSION_DIR/export``, must be absent or empty):

* ``patches/0001-....patch``: the kept commits as a patch series (``git
  format-patch`` from stock to the final stack; ``git am`` applies it), with
  the ``inferloom KEEP ...`` messages and their measured gains; for a server
  session with engine patches (``serving.engine_patches``), the kept engine
  patch as the session measured it (its text from the ledger), which
  ``deploy.sh`` runs through the session's overlay;
* ``final_config.json``: stock and final configuration, the knob changes,
  the pinned settings, the source commits and branch, the headline comparison
  and the rollback drill, each citing its ledger entry;
* ``deploy.md`` (and, for a server, ``deploy.sh``): the final stack as a user runs it
  (:mod:`inferloom.report.deploy`; ``deploy.sh`` passes its arguments on: ``--host``, ``--port``);
* ``README.md``: what it is and how to review it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inferloom.errors import InferloomError
from inferloom.patches.worktree import Workspace
from inferloom.redact import redact_text
from inferloom.report.breakdown import breakdown_from_ledger
from inferloom.report.deploy import deploy_markdown, session_deploy
from inferloom.session import ledger as L
from inferloom.session.state import load_state
from inferloom.workloads.vllm_engine_patches import ENGINE_PATCH_KNOB, patch_text

__all__ = ["ExportError", "export_session"]


class ExportError(InferloomError, ValueError):
    """The session can't be exported (what, why, what to do)."""


def export_session(session_dir: str | Path, out: str | Path | None = None) -> dict[str, Any]:
    d = Path(session_dir).absolute()
    st = load_state(d)
    out_dir = Path(out).absolute() if out else d / "export"
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ExportError(f"{out_dir} is not empty; choose another --out (an export never overwrites)")
    b = breakdown_from_ledger(L.read_entries(d))
    src = st.extra.source
    series: list[str] = []
    if src is not None and src.kept:
        pdir = out_dir / "patches"
        try:
            ws = Workspace(d / "workspace", "", date=src.date)  # the clone is there or it isn't: no user checkout
            files = ws.format_patches(src.stock, src.stack, pdir)
        except Exception:  # noqa: BLE001 - no clone left: the patch texts from the ledger
            ledger = L.Ledger(d)
            try:
                pdir.mkdir(parents=True, exist_ok=True)
                files = []
                for i, k in enumerate(src.kept, 1):
                    prop = ledger.find(k.proposal_key) or {}
                    f = pdir / f"{i:04d}-{k.id}.patch"
                    f.write_text(f"Subject: {k.message}\n\n" + (prop.get("text") or ""))
                    files.append(f)
            finally:
                ledger.close()
        series = [str(Path(f).relative_to(out_dir)) for f in files]
    engine = _engine_patch(out_dir, st, L.read_entries(d))
    series += engine.get("series", [])
    out_dir.mkdir(parents=True, exist_ok=True)
    changes = {k: v for k, v in st.stack.items() if st.stock_config.get(k) != v}
    doc = {"session_id": st.session_id, "phase": st.phase.value, "stop_reason": st.stop_reason,
           "stock_config": st.stock_config, "final_config": st.stack, "changes": changes, "pinned": st.pinned,
           "source": None if src is None else {"stock_commit": src.stock, "final_commit": src.stack, "branch": src.branch,
                                           "kept": [k.model_dump() for k in src.kept], "series": series},
           "final": b.get("final"), "rollback_drill": b.get("rollback_drill"), "engine_patches": engine or None,
           "review": "proposed change only: inferloom never promotes anything; review the series, rerun your own "
                     "acceptance tests, then merge through your normal release process"}
    (out_dir / "final_config.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    f = b.get("final") or {}
    head = (f"x{f['ratio']:.3f} [{f['ci_low']:.3f}, {f['ci_high']:.3f}] vs stock (ledger #{f['ledger_seq']})"
            if f.get("ledger_seq") else "nothing was kept")
    lines = [f"# inferloom session {st.session_id}: proposed changes", "",
             f"Final stack: {head}.", "", "Configuration changes: "
             + (", ".join(f"`{k}={v}`" for k, v in changes.items()) or "none") + "."]
    if src is not None:
        lines += ["", f"Source: {len(src.kept)} kept commit(s) on branch `{src.branch}` of the checkout, "
                  f"from stock `{src.stock[:12]}` to `{src.stack[:12]}`.", ""]
        lines += [f"- `{s}`" for s in series] or ["- no source change was kept"]
        rd = b.get("rollback_drill")
        if rd:
            lines += ["", f"Rollback drill: {'passed' if rd.get('passed') else 'FAILED'}: {rd.get('why')}."]
        lines += ["", "To review and apply (from the stock commit):", "",
                  "```sh", f"git switch -c review-{st.session_id} {src.stock[:12]}", "git am patches/*.patch", "```"]
    if engine:
        rd = b.get("rollback_drill")
        lines += ["", f"Engine patch: `{engine['series'][0]}` ({ENGINE_PATCH_KNOB}={engine['kept'][0]}), applied "
                  "by inferloom to a copy-on-write overlay of the installed package, never to the environment; "
                  "`deploy.sh` puts the session's overlay first on PYTHONPATH (or apply the patch to your vLLM "
                  "checkout: `git apply`)."]
        if rd:
            lines += ["", f"Rollback drill: {'passed' if rd.get('passed') else 'FAILED'}: {rd.get('why')}."]
    lines += ["", "inferloom never promotes anything: this is a proposal for a person to review."]
    dep = session_deploy(d)
    if dep is not None:  # the final stack as a user runs it (report.md's Deploy section)
        (out_dir / "deploy.md").write_text(redact_text(deploy_markdown(dep, st.session_id)))
        if dep.get("kind") == "command":
            sh = out_dir / "deploy.sh"
            sh.write_text(redact_text(f"#!/bin/sh\n# session {st.session_id}'s final stack (deploy.md); add --host/--port\n"
                                      f"exec env {dep['code']} \"$@\"\n"))  # env: the VAR=value prefixes, as typed
            sh.chmod(0o755)
        lines[-1:-1] = ["", "Deploy: `deploy.md`" + (" and `deploy.sh`" if dep.get("kind") == "command" else "")
                        + " (the final stack as a user runs it)."]
    (out_dir / "README.md").write_text("\n".join(lines) + "\n")
    return {"out": str(out_dir), "series": series, "changes": changes, "deploy": dep}


def _engine_patch(out_dir: Path, st: Any, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The final stack's engine patch (``engine_patch``), written as ``patches/0001-NAME.patch``; {} for none."""
    value = str(st.stack.get(ENGINE_PATCH_KNOB, "none"))
    text = None if value == "none" else patch_text(value, entries)
    if text is None:
        return {}
    pdir = out_dir / "patches"
    pdir.mkdir(parents=True, exist_ok=True)
    f = pdir / f"0001-{value}.patch"
    f.write_text(text)
    kept = next((e for e in reversed(entries) if e.get("kind") == "patch" and e.get("id") == value and e.get("kept")), {})
    return {"kept": [value], "series": [str(f.relative_to(out_dir))], "overlay": kept.get("overlay"),
            "verdict_seq": kept.get("verdict_seq")}
