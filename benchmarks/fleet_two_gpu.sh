#!/usr/bin/env bash
# Issue 17's device run: a two-session `inferloom fleet` on the two-GPU H200 machine, one session per GPU
# (Ray gives each GPU task its own CUDA_VISIBLE_DEVICES), both sessions at once, one shared SQLite KB
# (one host: WAL on a local disk; a fleet over several hosts shares PostgreSQL instead, docs/fleet.md).
#
# How to call it (the lead; device tool, kind nvidia-h200-x2, from the repository root):
#   bash benchmarks/fleet_two_gpu.sh            # starts the fleet; a later call resumes what a call's limit cut
# with `carry: [".whl"]`. The device's python3 (3.12, torch with CUDA) lacks pydantic / optuna / sqlalchemy
# and ray: fetch cp312 manylinux wheels here first (see benchmarks/gpu_session.sh for the first list), and ray:
#   python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 -d .whl "ray==2.60.0" msgpack protobuf "click>=7" filelock jsonschema \
#     attrs referencing rpds-py jsonschema-specifications packaging pyyaml requests idna urllib3 certifi \
#     charset-normalizer
# A ray wheel over the 64 MiB a call carries: split it (`split -b 60M .whl/ray-*.whl .whl/ray-parts/ray.whl.part-`,
# remove the whole wheel from .whl) and carry one part per call (`carry: [".whl/ray-parts/ray.whl.part-aa"]`,
# then `...-ab`; files carried earlier stay on the warm machine); this script joins them when all are there
# (RAY_PARTS: how many to expect, default 2).
# Leaves $OUT/fleet-h200.tgz (fleet directory: sessions, logs, fleet_report.html, KB) and $OUT/fleet-h200.log
# (with nvidia-smi samples every 10 s: both GPUs busy at once is the point).
set -uo pipefail
OUT=${OUT:-runs/fleet-two-gpu}; mkdir -p "$OUT"
LOG=$OUT/fleet-h200.log
if ! python3 -c "import ray" 2>/dev/null; then
  if ! ls .whl/ray-*.whl >/dev/null 2>&1 && [ -d .whl/ray-parts ]; then
    n=$(ls .whl/ray-parts/ray.whl.part-* 2>/dev/null | wc -l)
    [ "$n" -ge "${RAY_PARTS:-2}" ] || { echo "ray: $n of ${RAY_PARTS:-2} wheel parts here; carry the next" | tee -a "$LOG"; exit 3; }
    cat .whl/ray-parts/ray.whl.part-* > "/tmp/$(cat .whl/ray-parts/NAME 2>/dev/null || echo ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl)"
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl /tmp/ray-*.whl 2>&1 | tail -3 || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export INFERLOOM_GIT_REVISION=${INFERLOOM_GIT_REVISION:-unknown} RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
FLEET_DIR=/tmp/fleet-h200; mkdir -p "$FLEET_DIR"
[ -f "$FLEET_DIR/fleet_plan.json" ] || { [ -d .gpu/fleet-h200 ] && cp -r .gpu/fleet-h200/. "$FLEET_DIR/"; }
cat > /tmp/fleet-h200.yaml <<YAML
order: all-at-once            # one session per GPU, at the same time
defaults: {budget_minutes: ${BUDGET_MIN:-6}, max_trials: ${MAX_TRIALS:-4}, cycles: 1, sweep: false}
sessions:
  - {name: gpu-a, workload: $PWD/examples/llama-3.1-8b-h200.yaml, device: cuda}
  - {name: gpu-b, workload: {spec: $PWD/examples/llama-3.1-8b-h200.yaml, set: {traffic.concurrency: 32}}, device: cuda}
YAML
nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv | tee -a "$LOG"
( while sleep 10; do nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader \
    | sed "s/^/$(date +%T) gpu /"; done ) >> "$LOG" 2>&1 &
SAMPLER=$!
timeout -s KILL "${FLEET_TIMEOUT:-540}" python3 -m inferloom.cli fleet /tmp/fleet-h200.yaml --out "$FLEET_DIR" \
  --kb "$FLEET_DIR/kb.sqlite" --num-gpus 2 2>&1 | grep -v '^USDT' | tee -a "$LOG"
echo "exit: ${PIPESTATUS[0]}" | tee -a "$LOG"
kill "$SAMPLER" 2>/dev/null
cat "$FLEET_DIR"/logs/*.worker.json 2>/dev/null | tee -a "$LOG"; echo
tar czf "$OUT/fleet-h200.tgz" -C /tmp fleet-h200
