#!/usr/bin/env bash
# `inferloom verify --rebuild` end to end, the whole pin ledger (docs/evidence.md; docs/benchmarks.md, the
# section "verify --rebuild"): a custom demo session, then its virtualenv rebuilt from the pins and the final
# stack re-measured with that virtualenv's python; then the same again reusing the virtualenv.
#
#   bash benchmarks/verify_rebuild.sh                 # PY=.venv/bin/python OUT=/tmp/inferloom-verify-rebuild
#   PY=/path/to/python PYTHONPATH=src bash benchmarks/verify_rebuild.sh
#
# Writes OUT/demo (checkout + spec), OUT/session, OUT/venv (with inferloom-rebuild.json), OUT/timings.txt.
set -euo pipefail
PY=${PY:-.venv/bin/python}
OUT=${OUT:-/tmp/inferloom-verify-rebuild}
rm -rf "$OUT"
mkdir -p "$OUT"
"$PY" examples/custom/make_demo.py "$OUT/demo" --points 150 >/dev/null
"$PY" -m inferloom.cli optimize "$OUT/demo/custom.yaml" --budget-minutes 5 --max-trials 2 --no-kb --no-sweep \
    --out "$OUT/session" --quiet >/dev/null
t0=$(date +%s)
"$PY" -m inferloom.cli verify "$OUT/session" --rebuild --trust-session --venv "$OUT/venv" --max-pairs 6 | tee "$OUT/first.txt"
t1=$(date +%s)
cp "$OUT/venv/inferloom-rebuild.json" "$OUT/first.json"
"$PY" -m inferloom.cli verify "$OUT/session" --rebuild --trust-session --venv "$OUT/venv" --max-pairs 6 --quiet > "$OUT/second.txt"
t2=$(date +%s)
"$PY" - "$OUT" "$((t1 - t0))" "$((t2 - t1))" <<'PYEOF' | tee "$OUT/timings.txt"
import json, sys
out, first, second = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = json.load(open(f"{out}/first.json"))
s = r["seconds"]
s2 = json.load(open(f"{out}/venv/inferloom-rebuild.json"))["seconds"]
print(f"first verify --rebuild: {first} s: virtualenv {s['venv']:.0f} s, pins {s['pins']:.0f} s, inferloom "
      f"{s['inferloom']:.0f} s, rebuild total {s['total']:.0f} s, then the re-measure {r['remeasure']['seconds']:.0f} s")
print(f"second (virtualenv reused): {second} s: pins {s2['pins']:.0f} s, rebuild total {s2['total']:.0f} s")
print(f"pins {r['pins']}, installed {r['installed']}, matched {len(r['matched'])}, by version only {len(r['matched_version_only'])}, "
      f"other files {len(r['same_version_other_files'])}, differed {len(r['differed'])} {r['differed']}, "
      f"missing {len(r['missing'])}, extra {r['extra']}")
print(f"python {r['python']}; inferloom: {r['inferloom_source']['kind']} {r['inferloom_source']['commit'][:12]}")
m = r["remeasure"]
print(f"remeasure: passed {m['passed']}: {m['why']}; child {m['child']}")
PYEOF
