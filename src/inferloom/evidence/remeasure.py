"""``inferloom verify SESSION_DIR --remeasure``: rebuild the session's final stack in a fresh process and
measure it paired against stock again, through the same protocol and quality contract
(:func:`inferloom.bench.run_bench`); it passes when the new interval overlaps the session's CLOSE interval.

The fresh process (``python -m inferloom.evidence.remeasure``) starts from the session's files alone: the
spec from ``manifest.json``, stock and the final stack from ``state.json``; nothing of the session's
process (no warm model, cache or compiled graph) carries over. ``max_pairs`` caps its pairs (a smaller
budget than the session's; the interval is then wider, which makes overlap easier: the result says so).
A re-measurement whose quality contract fails does not pass, overlap or not.

Engine and server workloads: the final configuration of knobs. A custom workload: the session's exported
patch series applied to a fresh clone of the user's checkout at the recorded stock commit (rebuilding the
session's final commit, checked), then stock's tree against the final tree
(:mod:`inferloom.evidence.custom_remeasure`); it must also pass the session's clock check (inferloom's wall
clock around each re-measured run must see the gain the objective claims), overlap or not. ``python`` runs the fresh process (``verify --rebuild``: the
rebuilt virtualenv's, :mod:`inferloom.evidence.rebuild`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from inferloom.bench import run_bench
from inferloom.errors import InferloomError
from inferloom.evidence import custom_remeasure as CR
from inferloom.evidence.rebuild import venv_env
from inferloom.frameworks import framework
from inferloom.inputs import load_json
from inferloom.kernels import written, written_set
from inferloom.measure.protocol import ProtocolSettings
from inferloom.redact import without_secrets
from inferloom.sandbox import Sandbox, SandboxUnavailable, required
from inferloom.report.breakdown import breakdown_from_ledger
from inferloom.session import ledger as L
from inferloom.session.apart import env_apart, here_identity, identity, machine_apart
from inferloom.session.manifest import manifest_spec, read_manifest
from inferloom.session.state import Phase, load_state
from inferloom.workloads import registry as _engines
from inferloom.workloads.base import EngineTables
from inferloom.workloads.engine_ladder import check_session_stack

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["RemeasureError", "remeasure", "final_stack", "restore_engine_files"]


class RemeasureError(InferloomError, ValueError):
    """The session can't be re-measured (what, why, what to do): exit 2."""


def final_stack(d: Path, *, stock_ok: bool = False) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """``(spec, changes from stock, the session's CLOSE comparison)``; RemeasureError when there is none
    (unless ``stock_ok``: a final stack that is stock, ``changes`` empty, as an engine choice may pair).
    A custom workload's changes include ``patches``: the kept patches' ids, in order."""
    spec = manifest_spec(d, read_manifest(d))
    st = load_state(d)
    if st.phase != Phase.DONE:
        raise RemeasureError(f"{d}: session {st.session_id} is not closed (phase {st.phase.value}); it has no "
                             "CLOSE comparison to re-measure yet")
    final = breakdown_from_ledger(L.read_entries(d)).get("final") or {}
    if st.extra.enablement_changes:  # ENABLEMENT made stock run (a patch, an environment, a flag): part of stock
        spec = spec.model_copy(update={"pinned": {**st.extra.enablement_changes, **spec.pinned}})
        try:  # its patch file and wheels: the ones the session ran (sha256)
            check_session_stack(st.extra.enablement_changes, L.read_entries(d))
        except InferloomError as exc:
            raise RemeasureError(f"{d}: the recovered stock can't be re-measured: {exc}") from None
    changes: dict[str, Any] = {k: v for k, v in st.stack.items() if st.stock_config.get(k) != v}
    src = st.extra.source if framework(spec.framework).own_code else None
    if src is not None and src.kept:
        changes["patches"] = [k.id for k in src.kept]
    if not stock_ok and (not final.get("ledger_seq") or not changes):
        raise RemeasureError(f"{d}: nothing was kept (the final stack is stock); there is no headline ratio to "
                             "re-measure")
    restore_engine_files(d, spec, changes)
    return spec, changes, final


def restore_engine_files(d: Path, spec: Any, changes: dict[str, Any]) -> None:
    """What the final stack's ``changes`` need of the session's files before its engine is built again: a kept
    LLM-written kernel registered as the session did (sha256-checked), the engine overlays (a vLLM kernel plugin)
    rebuilt from the knobs and checked. :class:`RemeasureError` (one line) when one can't be."""
    if changes.get(written.KNOB, "none") != "none":  # a kept LLM-written kernel: registered as the session did
        try:
            written_set.restore_checked(d, [str(changes[written.KNOB])])  # each member of a combination
        except (written.WrittenKernelError, OSError, ValueError) as exc:
            raise RemeasureError(f"{d}: the final stack's {written.KNOB}={changes[written.KNOB]} can't be re-measured: "
                                 f"{exc}") from None
    try:  # engine overlays (a vLLM kernel plugin): rebuilt from the final stack's knobs, sha256-checked
        _engines.session_overlays(framework(spec.framework), d, changes, L.read_entries(d))
    except InferloomError as exc:
        raise RemeasureError(f"{d}: the final stack's engine overlays can't be re-measured: {exc}") from None


def _custom_child(d: Path, spec: WorkloadSpec) -> dict[str, Any]:
    st = load_state(d)

    def say(m: str) -> None:
        print(f"remeasure: {m}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="inferloom-remeasure-custom-") as tmp:
        trees = CR.rebuild_trees(d, spec, st, Path(tmp), RemeasureError, say)
        say(trees["why"])
        if trees["same_tree"] is False:
            return {"verdict": "failed", "error": trees["why"], "source": trees}
        aa = next((e for e in L.read_entries(d, L.MEASUREMENT) if e.get("action") == "measure_stock"), {})
        return CR.measure(spec, st, trees, Path(tmp), ProtocolSettings.from_spec(spec.protocol), say,
                          noise_pairs=(aa.get("protocol") or {}).get("pairs") or [])


def _kernel_sandbox(d: Path, changes: dict[str, Any]) -> Sandbox | None:
    """The sandbox the fresh process runs in when the final stack imports written kernels (Python the session's
    author wrote); None when it has none. :class:`RemeasureError` when bubblewrap can't run here."""
    if str(changes.get(written.KNOB, "none")) == "none":
        return None
    try:
        return required(f"the final stack of {d} imports kernels its author wrote (llm/kernels/)")
    except SandboxUnavailable as exc:
        raise RemeasureError(f"{exc}; nothing was run") from None


def _bench_final(d: Path, spec: Any, changes: dict[str, Any]) -> dict[str, Any]:
    """The final stack against stock; the tables its engine overlays carried (vLLM's tuned fused-MoE configs:
    the breakdown's ``final_engine_tables``) are handed to the adapter (``EngineTables``), so the servers
    run the session's tables, not a new tuning."""
    adapter = _engines.make_adapter(spec)
    try:
        tables = breakdown_from_ledger(L.read_entries(d)).get("final_engine_tables")
        if tables and isinstance(adapter, EngineTables):
            adapter.replay_tables(tables)
        return run_bench(spec, changes, adapter=adapter,
                         progress=lambda m: print(f"remeasure: {m}", file=sys.stderr, flush=True))
    finally:
        adapter.close()


def _child(args: list[str]) -> int:
    """The fresh process: measure the final stack of the session against stock; write the result JSON."""
    ap = argparse.ArgumentParser(prog="python -m inferloom.evidence.remeasure")
    ap.add_argument("dir")
    ap.add_argument("out")
    ap.add_argument("--max-pairs", type=int)
    a = ap.parse_args(args)
    spec, changes, _ = final_stack(Path(a.dir))
    if a.max_pairs:
        p = spec.protocol
        spec = spec.model_copy(update={"protocol": p.model_copy(update={
            "max_pairs": a.max_pairs, "min_pairs": min(p.min_pairs, a.max_pairs)})})
    if framework(spec.framework).own_code:
        res = _custom_child(Path(a.dir).absolute(), spec)
    else:
        res = _bench_final(Path(a.dir), spec, changes)
    res["pid"] = os.getpid()
    if written.registered():  # the kernels of the session's files this process registered (after their sha256)
        res["written_kernels"] = list(written.registered())
    res["child"] = {"python": sys.executable, "prefix": sys.prefix, "inferloom": str(Path(__file__).resolve().parents[1])}
    Path(a.out).write_text(json.dumps(res, default=str))
    return 0


def remeasure(directory: str | Path, *, max_pairs: int | None = None, timeout_s: float = 3600,
              progress: Callable[[str], None] = lambda _m: None, python: str | None = None) -> dict[str, Any]:
    """Re-measure the session's final stack in a fresh process of ``python`` (default: this interpreter; see
    the module docstring); returns ``{"session": {...}, "remeasured": {...}, "overlaps", "passed", "why",
    "pid", "python", "seconds"}`` (a custom workload's also ``source``: how its trees were rebuilt)."""
    d = Path(directory).absolute()
    spec, changes, final = final_stack(d)
    progress(f"re-measuring the final stack {changes} against stock in a fresh process "
             + (f"of {python} " if python else "")
             + (f"(custom workload {spec.custom.repo}" if spec.custom is not None else f"({spec.model}")
             + f", {spec.resolved_device()}); the session's CLOSE said x{final['ratio']:.3f} "
             f"[{final['ci_low']:.3f}, {final['ci_high']:.3f}] (ledger #{final['ledger_seq']})")
    m = read_manifest(d)  # where and how this run differs from the session's: said beside the numbers
    apart = machine_apart(identity(m), here_identity()) + env_apart(m, d.name)
    if apart:
        progress(f"re-measuring apart from the session: {'; '.join(apart)}")
    box = _kernel_sandbox(d, changes)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="inferloom-remeasure-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [python or sys.executable, "-m", "inferloom.evidence.remeasure", str(d), str(out)]
        if max_pairs:
            cmd += ["--max-pairs", str(max_pairs)]
        if box is not None:  # writable: only its result's directory; no network, no credentials of $HOME
            progress("the final stack imports kernels the session's author wrote: the fresh process runs in the "
                     "sandbox (bubblewrap: read-only root, no network)")
            cmd = box.wrap(cmd, cwd=tmp, writable=[tmp])
        try:
            # another python imports its own inferloom, not this one; the session's code gets no secret
            env = without_secrets(venv_env() if python else os.environ)
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            raise RemeasureError(f"{d}: the re-measurement ran past {timeout_s:.0f} s and was stopped; "
                                 "pass a smaller --max-pairs") from None
        if p.returncode != 0 or not out.is_file():
            raise RemeasureError(f"{d}: the re-measurement process failed (exit {p.returncode}; its messages are "
                                 "above); nothing was concluded")
        res = load_json(out.read_bytes(), int64=False)
    dec = (res.get("protocol") or {}).get("decision") or {}
    new = {"ratio": dec.get("ratio"), "ci_low": dec.get("ci_low"), "ci_high": dec.get("ci_high"),
           "n_pairs": dec.get("n_pairs"), "protocol_verdict": (res.get("protocol") or {}).get("verdict"),
           "verdict": res.get("verdict"), "quality_passed": (res.get("quality") or {}).get("passed")}
    src = res.get("source")
    if src is not None and src.get("same_tree") is False:
        overlaps, why = False, f"the rebuilt final stack is not the session's: {src.get('why')}"
    elif new["ci_low"] is None or new["ci_high"] is None:
        overlaps, why = False, f"the re-measurement produced no interval ({res.get('error') or res.get('verdict')})"
    else:
        overlaps = new["ci_low"] <= final["ci_high"] and final["ci_low"] <= new["ci_high"]
        why = (f"x{new['ratio']:.3f} [{new['ci_low']:.3f}, {new['ci_high']:.3f}] over {new['n_pairs']} pairs "
               + ("overlaps" if overlaps else "does NOT overlap")
               + f" the session's x{final['ratio']:.3f} [{final['ci_low']:.3f}, {final['ci_high']:.3f}] "
               f"over {final['n_pairs']} pairs (ledger #{final['ledger_seq']})")
    clock = res.get("clock") or {}  # a custom workload's: inferloom's clock against the claimed gain
    passed = overlaps and new["quality_passed"] is not False and not clock.get("rule")
    if overlaps and new["quality_passed"] is False:
        why += f"; but the quality contract FAILED ({'; '.join((res.get('quality') or {}).get('failed') or [])})"
    if clock.get("rule"):
        why += f"; but inferloom's clock check FAILED ({clock['rule']}: {clock.get('why')})"
    return {"session": {k: final.get(k) for k in ("ratio", "ci_low", "ci_high", "n_pairs", "ledger_seq")},
            "remeasured": new, "changes": changes, "overlaps": overlaps, "passed": passed, "why": why,
            "pid": res.get("pid"), "python": python or sys.executable, "child": res.get("child"), "max_pairs": max_pairs,
            "seconds": time.time() - t0, "sandboxed": box is not None, "apart": apart,
            **({"written_kernels": res["written_kernels"]} if res.get("written_kernels") else {}), **({"source": src} if src is not None else {}),
            **({"clock": clock} if clock else {})}


if __name__ == "__main__":
    try:
        sys.exit(_child(sys.argv[1:]))
    except InferloomError as exc:
        print(f"inferloom verify --remeasure: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
