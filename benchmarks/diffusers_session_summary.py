"""The summary of an image optimize session, read back from its ledger (nothing is computed here): stock and
final images/s, the kept and rejected changes, the refusals, and the per-step image roofline's ceiling and
fractions, each with its ledger seq. Used by benchmarks/gpu_diffusers_session.sh.

    python benchmarks/diffusers_session_summary.py SESSION_DIR [--out summary.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from inferloom.report.breakdown import breakdown_from_ledger
from inferloom.session import ledger as L


def _roof(r: dict | None) -> dict | None:
    if not r:
        return None
    keys = ("measured_images_per_s", "ceiling_images_per_s", "fraction", "headroom", "floor_s", "steps", "batch",
            "height", "width", "cfg", "step_share_of_floor", "suspect", "reason")
    out = {k: r.get(k) for k in keys if k in r}
    out["denoise_step"] = {k: (r.get("denoise_step") or {}).get(k) for k in ("flops", "bytes", "floor_s", "bound")}
    out["decode"] = {k: (r.get("decode") or {}).get(k) for k in ("flops", "bytes", "floor_s", "bound")}
    return out


def summarize(d: Path) -> dict:
    b = breakdown_from_ledger(L.read_entries(d))
    rf = b.get("roofline") or {}
    return {
        "session": str(d), "objective_label": b.get("objective_label"), "stop_reason": b.get("stop_reason"),
        "stock": b.get("stock"), "final": b.get("final"),
        "kept": b.get("action_path"), "rejected": b.get("rejected"), "refusals": b.get("refusals"),
        "stock_config": b.get("stock_config"), "final_config": b.get("final_config"), "time_s": b.get("time_s"),
        "roofline": {"ceilings": rf.get("ceilings"), "stock": _roof(rf.get("stock")), "final": _roof(rf.get("final")),
                     "stock_seq": rf.get("stock_seq"), "final_seq": rf.get("final_seq")} if rf else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    d = Path(a.dir)
    if not (d / "ledger.jsonl").is_file():
        print(f"{d}: no ledger.jsonl; the session never started (see the log)", file=sys.stderr)
        return 1
    s = summarize(d)
    text = json.dumps(s, indent=1, default=str)
    if a.out:
        Path(a.out).write_text(text + "\n", encoding="utf-8")
    r = (s["roofline"] or {}).get("stock") or {}
    f = (s["roofline"] or {}).get("final") or {}
    print(f"stock {r.get('measured_images_per_s')} images/s, ceiling {r.get('ceiling_images_per_s')} images/s, "
          f"fraction {r.get('fraction')}; final {f.get('measured_images_per_s')} images/s, fraction "
          f"{f.get('fraction')}; stop: {s['stop_reason']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
