#!/usr/bin/env bash
# Issue 3, 4 and 7 GPU runs: one unattended `inferloom optimize` session per call on
# one H200 (llama-3.1-8b preset, bf16, concurrency 64, 256 in / 128 out).
#   bash benchmarks/gpu_session.sh first     # stock start, files its recipe in the KB
#   bash benchmarks/gpu_session.sh second    # same workload, warm-starts from that KB
# The KB lives at $KB (default /tmp/inferloom-kb.sqlite, which survives between
# calls while the machine stays warm); when it is missing there and
# .gpu/kb.sqlite exists (the first call's KB, carried back), that copy is used.
# Each call leaves $OUT/<name>.tgz (session directory + KB) and $OUT/<name>.log.
# Issue 7's campaign (FRAMEWORK then KERNEL with the Triton catalog; about 20
# session minutes, so 2-3 calls, carrying .gpu/<name> back between them):
#   SPEC=examples/llama-3.1-8b-h200-campaign.yaml BUDGET_MIN=16 MAX_TRIALS=5 \
#     SESSION_TIMEOUT=550 OPTIMIZE_ARGS=--no-sweep bash benchmarks/gpu_session.sh campaign
#
# The device has no pydantic / optuna / sqlalchemy: fetch cp312 wheels here first
# (repository root; .whl/ is git-ignored and carried with `carry: [".whl"]`):
#   for p in pydantic==2.14.4 pydantic_core==2.50.5 annotated-types typing-inspection \
#            "typing-extensions>=4.16" optuna sqlalchemy alembic colorlog Mako greenlet; do
#     python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 -d .whl "$p"; done
set -uo pipefail
NAME=${1:-first}
OUT=${OUT:-runs/gpu-session}; mkdir -p "$OUT"
if ! python3 -c "import pydantic, optuna, sqlalchemy" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
KB=${KB:-/tmp/inferloom-kb.sqlite}
[ -f "$KB" ] || { [ -f .gpu/kb.sqlite ] && cp .gpu/kb.sqlite "$KB"; }
export INFERLOOM_KB=$KB INFERLOOM_GIT_REVISION=${INFERLOOM_GIT_REVISION:-unknown}
SPEC=${SPEC:-examples/llama-3.1-8b-h200.yaml}
# the catalog's shape-tuned configs measured on this device (docs/results/h200-kernels-*)
export INFERLOOM_KERNEL_CACHE=${INFERLOOM_KERNEL_CACHE:-/tmp/inferloom-kcache}
mkdir -p "$INFERLOOM_KERNEL_CACHE/kernel_tuning"
for f in docs/results/h200-kernels-*/tuning-*.json; do
  [ -f "$f" ] && cp -n "$f" "$INFERLOOM_KERNEL_CACHE/kernel_tuning/${f##*/tuning-}"; done
DIR=/tmp/sessions/$NAME; mkdir -p /tmp/sessions
# a session cut short on a machine that has since gone back: resume the carried copy
[ -d "$DIR" ] || { [ -f ".gpu/$NAME/state.json" ] && cp -r ".gpu/$NAME" "$DIR"; }
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv | tee "$OUT/$NAME.log"
if [ -f "$DIR/state.json" ]; then CMD=(resume "$DIR"); else
  # OPTIMIZE_ARGS: more optimize flags, e.g. "--no-sweep" (kept in state.json: a resume honours them)
  CMD=(optimize "$SPEC" --budget-minutes "${BUDGET_MIN:-6}" --max-trials "${MAX_TRIALS:-5}" --out "$DIR" ${OPTIMIZE_ARGS:-}); fi
# A session cut short by the call's limit resumes from its state on the next call.
timeout -s KILL "${SESSION_TIMEOUT:-540}" python3 -m inferloom.cli "${CMD[@]}" 2>&1 | tee -a "$OUT/$NAME.log"
echo "exit: ${PIPESTATUS[0]}" | tee -a "$OUT/$NAME.log"
# a finished session: profile its final stack (PROFILE_FINAL=0 skips it)
if [ "${PROFILE_FINAL:-1}" = 1 ] && python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["phase"] != "DONE")' "$DIR/state.json" 2>/dev/null; then
  timeout -s KILL "${PROFILE_TIMEOUT:-200}" python3 benchmarks/profile_stack.py "$DIR" --out "$DIR/final_profile.json" \
    2>&1 | grep -v '^USDT' | tee -a "$OUT/$NAME.log"; fi
cp "$KB" /tmp/sessions/kb.sqlite
tar czf "$OUT/$NAME.tgz" -C /tmp/sessions "$NAME" kb.sqlite
