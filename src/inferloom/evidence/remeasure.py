"""``inferloom verify SESSION_DIR --remeasure``: rebuild the session's final stack in a fresh process and
measure it paired against stock again, through the same protocol and quality contract
(:func:`inferloom.bench.run_bench`); it passes when the new interval overlaps the session's CLOSE interval.

The fresh process (``python -m inferloom.evidence.remeasure``) starts from the session's files alone: the
spec from ``manifest.json``, stock and the final stack from ``state.json``; nothing of the session's
process (no warm model, cache or compiled graph) carries over. ``max_pairs`` caps its pairs (a smaller
budget than the session's; the interval is then wider, which makes overlap easier: the result says so).

Engine and server workloads (a configuration of knobs) only: a custom workload's final stack is a patch
series on the user's checkout, and re-measuring it (the series applied to a fresh clone) is not built yet
(:class:`RemeasureError` says so). ``--rebuild`` (a fresh virtualenv from the pin ledger first) is not
built yet either.
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
from typing import Any, Callable

from inferloom.bench import run_bench
from inferloom.errors import InferloomError
from inferloom.inputs import load_json
from inferloom.report.breakdown import breakdown_from_ledger
from inferloom.session import ledger as L
from inferloom.session.manifest import manifest_spec, read_manifest
from inferloom.session.state import Phase, load_state

__all__ = ["RemeasureError", "remeasure", "final_stack"]


class RemeasureError(InferloomError, ValueError):
    """The session can't be re-measured (what, why, what to do): exit 2."""


def final_stack(d: Path) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """``(spec, changes from stock, the session's CLOSE comparison)``; RemeasureError when there is none."""
    spec = manifest_spec(d, read_manifest(d))
    st = load_state(d)
    if spec.framework == "custom":
        raise RemeasureError(f"{d}: a custom workload's final stack is a patch series on your checkout; re-measuring "
                             "it (the exported series applied to a fresh clone) is not built yet: apply "
                             f"`inferloom export {d}` to a clean clone and run `inferloom bench` there")
    if st.phase != Phase.DONE:
        raise RemeasureError(f"{d}: session {st.session_id} is not closed (phase {st.phase.value}); it has no "
                             "CLOSE comparison to re-measure yet")
    final = breakdown_from_ledger(L.read_entries(d)).get("final") or {}
    changes = {k: v for k, v in st.stack.items() if st.stock_config.get(k) != v}
    if not final.get("ledger_seq") or not changes:
        raise RemeasureError(f"{d}: nothing was kept (the final stack is stock); there is no headline ratio to "
                             "re-measure")
    return spec, changes, final


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
    res = run_bench(spec, changes, progress=lambda m: print(f"remeasure: {m}", file=sys.stderr, flush=True))
    res["pid"] = os.getpid()
    Path(a.out).write_text(json.dumps(res, default=str))
    return 0


def remeasure(directory: str | Path, *, max_pairs: int | None = None, timeout_s: float = 3600,
              progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Re-measure the session's final stack in a fresh process (see the module docstring); returns
    ``{"session": {...}, "remeasured": {...}, "overlaps", "passed", "why", "pid", "seconds"}``."""
    d = Path(directory).absolute()
    spec, changes, final = final_stack(d)
    progress(f"re-measuring the final stack {changes} against stock in a fresh process "
             f"({spec.model}, {spec.resolved_device()}); the session's CLOSE said x{final['ratio']:.3f} "
             f"[{final['ci_low']:.3f}, {final['ci_high']:.3f}] (ledger #{final['ledger_seq']})")
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="inferloom-remeasure-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "inferloom.evidence.remeasure", str(d), str(out)]
        if max_pairs:
            cmd += ["--max-pairs", str(max_pairs)]
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True, timeout=timeout_s)
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
    if new["ci_low"] is None or new["ci_high"] is None:
        overlaps, why = False, f"the re-measurement produced no interval ({res.get('error') or res.get('verdict')})"
    else:
        overlaps = new["ci_low"] <= final["ci_high"] and final["ci_low"] <= new["ci_high"]
        why = (f"x{new['ratio']:.3f} [{new['ci_low']:.3f}, {new['ci_high']:.3f}] over {new['n_pairs']} pairs "
               + ("overlaps" if overlaps else "does NOT overlap")
               + f" the session's x{final['ratio']:.3f} [{final['ci_low']:.3f}, {final['ci_high']:.3f}] "
               f"over {final['n_pairs']} pairs (ledger #{final['ledger_seq']})")
    return {"session": {k: final.get(k) for k in ("ratio", "ci_low", "ci_high", "n_pairs", "ledger_seq")},
            "remeasured": new, "changes": changes, "overlaps": overlaps, "passed": overlaps, "why": why,
            "pid": res.get("pid"), "max_pairs": max_pairs, "seconds": time.time() - t0}


if __name__ == "__main__":
    try:
        sys.exit(_child(sys.argv[1:]))
    except InferloomError as exc:
        print(f"inferloom verify --remeasure: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
