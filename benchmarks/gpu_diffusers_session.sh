#!/usr/bin/env bash
# Issue 16: one unattended `inferloom optimize` session of stock diffusers 0.42.1 on one H200, on the
# SD3-Medium-shaped MMDiT at 1024x1024, 28 steps, bf16 (examples/sd3-medium-h200-session.yaml), in one
# device call of at most ~9.5 minutes; it records the session's ceiling fraction (the per-step image
# roofline, measure/diffusion_costs.py) and leaves under $OUT:
#   session.log          the session's output (and nvidia-smi before and after)
#   diffusers-session.tgz the session directory (ledger, state, manifest, report) and the KB
#   report.html          `inferloom report --html` of the session (the image roofline section)
#   summary.json         stock and final images/s, the kept changes, the ceiling and the fractions,
#                        each with its ledger seq (read back from the ledger, nothing computed here)
#
# Device command (the lead; .whl/ is git-ignored, so carry it):
#   run(kind="nvidia-h200", carry=[".whl/py", ".whl/diff"], timeout_s=600,
#       command="bash benchmarks/gpu_diffusers_session.sh")
# Expected: ~6-7 minutes of the command (wheels ~20 s; PRELUDE ~1.5 min: A/A of stock, quality
# references, profile, ceilings; trials: compile_mode=default ~2 min with its compilation, fuse_qkv
# and channels_last ~40 s each (sdpa flash and cudnn are refused up front: the VAE's 512-dim heads);
# CLOSE ~30 s), plus the machine's start. If the call is cut (SESSION_TIMEOUT, SIGINT), the session is
# resumable: unpack $OUT/diffusers-session.tgz into .gpu/ here and run again with carry
# [".whl/py", ".whl/diff", ".gpu/diffusers-session"].
#
# Wheels (here, once; cp312 for the image's Python):
#   .whl/py:   pydantic, optuna, sqlalchemy and their dependencies (benchmarks/gpu_vllm_session.sh's list)
#   .whl/diff: diffusers==0.42.1 importlib-metadata zipp (and scikit-image==0.26.0 imageio tifffile
#              lazy-loader networkx if the image lacks skimage: the script says so)
#   for p in diffusers==0.42.1 importlib-metadata zipp; do python3 -m pip download -q --no-deps \
#     --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl/diff "$p"; done
# Env: SPEC (examples/sd3-medium-h200-session.yaml), BUDGET_MIN (7), MAX_TRIALS (3),
# SESSION_TIMEOUT (540), OPTIMIZE_ARGS, KB (/tmp/inferloom-kb.sqlite), NAME (diffusers-session).
set -uo pipefail
OUT=${OUT:-runs/gpu-diffusers-session}; mkdir -p "$OUT"
NAME=${NAME:-diffusers-session}; LOG="$OUT/session.log"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

if ! python3 -c "import pydantic, optuna, sqlalchemy, diffusers, skimage" 2>/dev/null; then
  w=$(ls .whl/py/*.whl .whl/diff/*.whl .whl/*.whl 2>/dev/null)
  [ -n "$w" ] || { echo "no wheels under .whl/py or .whl/diff: carry them (see this script's header)" | tee "$LOG"; exit 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $w || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
python3 -c "import pydantic, optuna, sqlalchemy, diffusers, skimage" 2>>"$LOG" || {
  echo "an import failed (stderr in $LOG): skimage missing means scikit-image==0.26.0 imageio tifffile lazy-loader" \
       "networkx must join .whl/diff" | tee -a "$LOG"; exit 1; }
KB=${KB:-/tmp/inferloom-kb.sqlite}
export INFERLOOM_KB=$KB INFERLOOM_GIT_REVISION=${INFERLOOM_GIT_REVISION:-unknown}
DIR=/tmp/sessions/$NAME; mkdir -p /tmp/sessions
[ -d "$DIR" ] || { [ -f ".gpu/$NAME/state.json" ] && cp -r ".gpu/$NAME" "$DIR" && echo "resuming the carried copy" | tee -a "$LOG"; }
[ -f "$KB" ] || { [ -f "$DIR/kb.sqlite" ] && cp "$DIR/kb.sqlite" "$KB"; }
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv | tee -a "$LOG"
if [ -f "$DIR/state.json" ]; then CMD=(resume "$DIR"); else
  CMD=(optimize "${SPEC:-examples/sd3-medium-h200-session.yaml}" --budget-minutes "${BUDGET_MIN:-7}"
       --max-trials "${MAX_TRIALS:-3}" --out "$DIR" ${OPTIMIZE_ARGS:-}); fi
T=${SESSION_TIMEOUT:-540}; LEFT=$(( ${CALL_S:-575} - SECONDS - 30 )); [ "$LEFT" -lt "$T" ] && T=$LEFT
echo "inferloom ${CMD[*]} (cut with SIGINT at ${T} s: resumable)" | tee -a "$LOG"
timeout -s INT -k 30 "$T" python3 -m inferloom.cli "${CMD[@]}" 2>&1 | tee -a "$LOG"
echo "exit: ${PIPESTATUS[0]} (124: cut by the timeout; resume as the header says)" | tee -a "$LOG"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tee -a "$LOG"  # should be empty
python3 -m inferloom.cli report "$DIR" --html --out "$OUT/report.html" >> "$LOG" 2>&1 || echo "report: failed (see the log)"
python3 benchmarks/diffusers_session_summary.py "$DIR" --out "$OUT/summary.json" 2>&1 | tee -a "$LOG"
cp "$KB" "$DIR/kb.sqlite" 2>/dev/null
tar czf "$OUT/$NAME.tgz" -C /tmp/sessions "$NAME"
