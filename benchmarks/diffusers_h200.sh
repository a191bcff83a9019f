#!/usr/bin/env bash
# Issue 16's H200 runs: an SD3-Medium-shaped MMDiT at 1024x1024, 28 steps, bf16
# (examples/sd3-medium-h200.yaml), stock diffusers against what a session finds.
#   bash benchmarks/diffusers_h200.sh calibrate   # the image quality contract's calibration
#                                                 # table at this shape (~3 min): docs/quality.md
#   bash benchmarks/diffusers_h200.sh aa          # `inferloom bench --aa`: the noise floor (~2 min)
#   bash benchmarks/diffusers_h200.sh session     # one unattended `inferloom optimize` (resumable:
#                                                 # a call cut short by the 10-minute limit resumes
#                                                 # from .gpu/diffusers-session on the next call)
# Leaves $OUT/<mode>.log and, for a session, $OUT/diffusers-session.tgz (session directory + KB).
# BUDGET_MIN (default 18), MAX_TRIALS (default 6), SESSION_TIMEOUT (default 560) size the session.
#
# diffusers is pure Python; it and scikit-image (the PSNR / SSIM) come as cp312 wheels in .whl/
# (git-ignored; run on the device with carry [".whl"]), fetched here beside gpu_session.sh's:
#   for p in diffusers==0.42.1 scikit-image==0.26.0 imageio tifffile lazy-loader networkx \
#            pillow regex importlib-metadata zipp; do
#     python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 -d .whl "$p"; done
set -uo pipefail
MODE=${1:-session}
OUT=${OUT:-runs/diffusers-h200}; mkdir -p "$OUT"
if ! python3 -c "import pydantic, optuna, sqlalchemy, diffusers, skimage" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    $(ls .whl/*.whl .whl/py/*.whl .whl/diff/*.whl 2>/dev/null) || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
KB=${KB:-/tmp/inferloom-kb.sqlite}
[ -f "$KB" ] || { [ -f .gpu/kb.sqlite ] && cp .gpu/kb.sqlite "$KB"; }
export INFERLOOM_KB=$KB INFERLOOM_GIT_REVISION=${INFERLOOM_GIT_REVISION:-unknown}
SPEC=${SPEC:-examples/sd3-medium-h200.yaml}
LOG="$OUT/$MODE.log"
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv | tee "$LOG"
case "$MODE" in
  calibrate)
    timeout -s KILL 560 python3 benchmarks/diffusers_quality_calibration.py --model sd3-medium-shaped --device cuda \
      --dtype bfloat16 --size 1024 --steps 28 --guidance 7.0 --images 4 --json "$OUT/calibration.json" 2>&1 | tee -a "$LOG" ;;
  aa)
    timeout -s KILL 560 python3 -m inferloom.cli bench "$SPEC" --aa --out "$OUT/aa.json" 2>&1 | tee -a "$LOG" ;;
  session)
    NAME=diffusers-session; DIR=/tmp/sessions/$NAME; mkdir -p /tmp/sessions
    [ -d "$DIR" ] || { [ -f ".gpu/$NAME/state.json" ] && cp -r ".gpu/$NAME" "$DIR"; }
    if [ -f "$DIR/state.json" ]; then CMD=(resume "$DIR"); else
      CMD=(optimize "$SPEC" --budget-minutes "${BUDGET_MIN:-18}" --max-trials "${MAX_TRIALS:-6}" --out "$DIR" ${OPTIMIZE_ARGS:-}); fi
    timeout -s KILL "${SESSION_TIMEOUT:-560}" python3 -m inferloom.cli "${CMD[@]}" 2>&1 | tee -a "$LOG"
    echo "exit: ${PIPESTATUS[0]}" | tee -a "$LOG"
    cp "$KB" /tmp/sessions/kb.sqlite
    tar czf "$OUT/$NAME.tgz" -C /tmp/sessions "$NAME" kb.sqlite ;;
  *) echo "usage: $0 calibrate|aa|session" >&2; exit 2 ;;
esac
