"""What benchmarks/fleet_two_gpu.sh's fleet did, read from the fleet directory's own files: per session its
status, trials, final ratio, the CUDA_VISIBLE_DEVICES Ray gave its worker, and when its last attempt ran;
then the run's checks: every session closed; with GPUs, each session on its own GPU; the sessions ran at
the same time (their attempts' intervals overlap). Writes the JSON to --out, prints a short table, and
exits 1 when a check fails (the table says which)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _json(p: Path) -> Any:
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def check(fleet: Path, gpus: int) -> dict[str, Any]:
    summary = _json(fleet / "fleet_summary.json") or {}
    rows = []
    for r in summary.get("sessions") or []:
        worker = _json(fleet / "logs" / f"{r['name']}.worker.json") or {}
        result = fleet / "logs" / f"{r['name']}.result.json"
        rows.append({"name": r["name"], "status": r["status"], "workload": r["workload"],
                     "trials": r["trials_used"], "session_min": round(r["elapsed_s"] / 60, 2),
                     "ratio": r["ratio"], "ci": [r["ci_low"], r["ci_high"]], "verdict": r["verdict"],
                     "kept": r["kept"], "stop_reason": r["stop_reason"], "error": r["error"],
                     "attempt": worker.get("attempt"), "host": worker.get("host"),
                     "ray_node": worker.get("ray_node_id"),
                     "cuda_visible_devices": worker.get("cuda_visible_devices"),
                     "started_at": worker.get("started_at"),
                     "ended_at": result.stat().st_mtime if result.is_file() else None})
    checks: dict[str, Any] = {"all_closed": bool(rows) and all(r["status"] == "done" for r in rows)}
    if gpus:
        cvd = [r["cuda_visible_devices"] for r in rows]
        checks["own_gpu_each"] = len(rows) <= gpus and None not in cvd and len(set(cvd)) == len(cvd)
    spans = [(r["started_at"], r["ended_at"]) for r in rows if r["started_at"] and r["ended_at"]]
    if len(spans) == len(rows) >= 2:
        overlap = min(e for _s, e in spans) - max(s for s, _e in spans)
        checks["overlap_s"] = round(overlap, 1)
        checks["ran_at_once"] = overlap > 0
    else:
        checks["ran_at_once"] = False
    return {"fleet": str(fleet), "sessions": rows, "checks": checks,
            "trials_used": sum(r["trials"] for r in rows), "kb_learned": summary.get("kb_learned")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fleet", type=Path, help="the fleet directory (--out of inferloom fleet)")
    ap.add_argument("--gpus", type=int, default=0, help="GPUs the fleet had (0: a CPU run)")
    ap.add_argument("--out", type=Path, help="write the JSON here")
    a = ap.parse_args(argv)
    res = check(a.fleet, a.gpus)
    if a.out:
        a.out.write_text(json.dumps(res, indent=1, default=str) + "\n", encoding="utf-8")
    for r in res["sessions"]:
        ratio = "no final ratio" if r["ratio"] is None else f"final x{r['ratio']:.3f}" + (
            f" [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]" if None not in r["ci"] else "") + f" {r['verdict'] or ''}"
        print(f"{r['name']}: {r['status']}, {r['trials']} trials, {r['session_min']} min, GPU "
              f"{r['cuda_visible_devices']}, attempt {r['attempt']}; {ratio}; kept {r['kept'] or 'nothing'}; "
              f"{r['error'] or r['stop_reason']}")
    print("checks: " + json.dumps(res["checks"]))
    failed = [k for k, v in res["checks"].items() if v is False]
    if failed:
        print("FAILED: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
