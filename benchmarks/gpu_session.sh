#!/usr/bin/env bash
# Issue 3 and 4 GPU runs: two unattended `inferloom optimize` sessions on one
# H200 (llama-3.1-8b preset, bf16, concurrency 64, 256 in / 128 out); the
# second warm-starts from the first one's recipe in a fresh KB under $OUT.
#
# The device has no pydantic / optuna / sqlalchemy: fetch cp312 wheels here first
# (repository root; .whl/ is git-ignored and carried with `carry: [".whl"]`):
#   for p in pydantic==2.14.4 pydantic_core==2.50.5 annotated-types typing-inspection \
#            "typing-extensions>=4.16" optuna sqlalchemy alembic colorlog Mako greenlet; do
#     python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 -d .whl "$p"; done
set -uo pipefail
OUT=${OUT:-runs/gpu-session}; mkdir -p "$OUT"
if ! python3 -c "import pydantic, optuna, sqlalchemy" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export INFERLOOM_KB=$OUT/kb.sqlite INFERLOOM_GIT_REVISION=${INFERLOOM_GIT_REVISION:-unknown}
SPEC=examples/llama-3.1-8b-h200.yaml
for s in first second; do
  echo "=== session $s" | tee -a "$OUT/gpu-session.log"
  python3 -m inferloom.cli optimize $SPEC --budget-minutes ${BUDGET_MIN:-9} --max-trials ${MAX_TRIALS:-5} \
    --out "$OUT/$s" 2>&1 | tee -a "$OUT/gpu-session.log"
done
