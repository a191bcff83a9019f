"""What ``verify --remeasure`` / ``--rebuild`` would run of a handed-over session, said before anything runs.

A session directory is someone else's work: its manifest names the server interpreter, its environment and
arguments, a custom workload's entrypoint and patches, and its ``llm/kernels/`` folder holds Python that the
re-measure imports. :func:`plan_lines` reads all of that from the files alone (nothing of the session is
imported or run) and says it, one line each; the CLI runs it only after ``--trust-session``
(docs/security.md, "Handed-over sessions"). The re-measure's own process then gets an environment without
secret-named variables (:func:`inferloom.redact.without_secrets`).
"""

from __future__ import annotations

from pathlib import Path

from inferloom.agents.llm_record import read_exchanges
from inferloom.evidence.remeasure import final_stack
from inferloom.frameworks import framework
from inferloom.inputs import load_json
from inferloom.kernels import written, written_set
from inferloom.redact import is_secret_name, redact_text
from inferloom.session.manifest import read_manifest

__all__ = ["plan_lines", "replay_lines", "TRUST_FLAG", "CODE_ROLES"]

TRUST_FLAG = "--trust-session"

#: LLM roles whose replies are code that runs here: what each one's replay does with it
CODE_ROLES = {"kernel_author": "Python kernels this process imports and runs (through the kernel guards and gates; "
                               "not sandboxed)",
              "specialist": "source patches (a custom workload's; applied and run in its sandbox)"}


def _kernels(d: Path, value: str) -> list[str]:
    book = d / "llm" / "kernels" / written.PASSED
    known = load_json(book.read_bytes()) if book.is_file() else {}
    out = []
    for member in written_set.members(value):
        rec = known.get(member) or {}
        out.append(f"  imports the written kernel {member}: {book.parent / str(rec.get('path'))} "
                   f"(sha256 {rec.get('sha256')}) in the re-measure process, "
                   "sandboxed (bubblewrap: read-only root, no network; refused where it can't run)")
    return out


def plan_lines(directory: str | Path, *, rebuild: bool = False, stock_ok: bool = False) -> list[str]:
    """What re-measuring (``rebuild``: also rebuilding) the session in ``directory`` would run, one line each
    (``stock_ok``: a final stack that is stock is one too, as for an engine choice)."""
    d = Path(directory).absolute()
    spec, changes, _ = final_stack(d, stock_ok=stock_ok)  # checks written kernels' containment and sha256; runs nothing
    said = f"the final stack's changes: {redact_text(str(changes))}" if changes else "the final stack is stock"
    lines = [f"{d} was written by someone else's inferloom run; re-measuring it runs the following on this machine:",
             f"  framework {spec.framework}, model {spec.model}; {said}"]
    serving = spec.serving
    if framework(spec.framework).server:
        lines.append(f"  the server: {serving.python} -m {serving.module} {' '.join(serving.extra_args)}".rstrip())
        for k, v in sorted(serving.env.items()):
            lines.append(f"  server environment: {k}={'***' if is_secret_name(k) else redact_text(v)}")
    if spec.custom is not None:
        c = spec.custom
        lines.append(f"  the entrypoint {' '.join(c.entrypoint)} in a copy of {c.repo} (always sandboxed for a "
                     f"handed-over session, whatever its custom.sandbox: {c.sandbox} says); "
                     f"{len(changes.get('patches') or [])} exported patch(es) applied first")
    if changes.get(written.KNOB, "none") != "none":
        lines += _kernels(d, str(changes[written.KNOB]))
    if rebuild:
        pins = read_manifest(d).get("pins") or {}
        pkgs = pins.get("packages") if isinstance(pins, dict) else None
        n = len(pkgs) if isinstance(pkgs, list) else 0
        lines.append(f"  pip installs the manifest's {n} pinned package(s) (binary wheels only) into a new virtualenv")
    lines.append(f"  the re-measure process gets your environment less secret-named variables; pass {TRUST_FLAG} "
                 "to run it")
    return lines


def replay_lines(source: str | Path) -> list[str]:
    """What ``optimize --llm-replay SOURCE`` would run of that session's recorded replies, one line each; [] when
    none of them is code (configuration proposals and critic rulings only: nothing to trust)."""
    d = Path(source).absolute()
    roles: dict[str, int] = {}
    for rec in read_exchanges(d):
        roles[str(rec.get("role"))] = roles.get(str(rec.get("role")), 0) + 1
    code = {r: n for r, n in roles.items() if r in CODE_ROLES}
    if not code:
        return []
    lines = [f"{d}'s recorded LLM replies would answer this session; some are code that runs on this machine:"]
    lines += [f"  {n} {role} repl{'y' if n == 1 else 'ies'}: {CODE_ROLES[role]}" for role, n in sorted(code.items())]
    others = sum(n for r, n in roles.items() if r not in CODE_ROLES)
    if others:
        lines.append(f"  {others} other repl{'y' if others == 1 else 'ies'} (proposals, rulings: configuration only)")
    lines.append(f"  replay only a session you trust: pass {TRUST_FLAG} to run it (docs/security.md)")
    return lines
