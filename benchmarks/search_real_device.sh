#!/usr/bin/env bash
# Issue 15 part (b) on a quiet machine: benchmarks/search_efficiency_real.py's `measure` on the device
# host's CPU cores (the GPU is not used), in SHARDS shards side by side, each pinned to its own cores
# with taskset and as many torch threads, then `search` over the shards (median and mean).
#
#   run(kind="nvidia-h200", carry=[".whl/py"], timeout_s=600,
#       command="INFERLOOM_GIT_REVISION=<sha> bash benchmarks/search_real_device.sh")
#
# .whl/py: pydantic, optuna, sqlalchemy and their dependencies for Python 3.12 (the download is in
# benchmarks/gpu_vllm_session.sh's header). Env: SHARDS (4), PAIRS (7), MEASURE_S (470: each shard is cut
# there; its table keeps the rows measured so far), SET (traffic overrides for `measure --set`).
set -uo pipefail
OUT=${OUT:-runs/search-real-device}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false CUDA_VISIBLE_DEVICES=""
python3 -c "import pydantic, optuna, sqlalchemy" 2>/dev/null || {
  w=$(ls .whl/py/*.whl 2>/dev/null); [ -n "$w" ] || { echo "no wheels in .whl/py: carry them (header)"; exit 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $w || exit 1; }
export PYTHONPATH=$PWD/src:/tmp/site
(lscpu; nproc; uptime) > "$OUT/machine.txt" 2>&1
SHARDS=${SHARDS:-4}; PAIRS=${PAIRS:-7}; N=$(nproc); PER=$(( N / SHARDS ))
[ "$PER" -ge 1 ] || { echo "SHARDS=$SHARDS is more than the $N cores"; exit 1; }
SETS=(); for s in ${SET:-traffic.num_prompts=8 traffic.output_len=32}; do SETS+=(--set "$s"); done
pids=()
for k in $(seq 0 $((SHARDS - 1))); do
  cores="$((k * PER))-$((k * PER + PER - 1))"
  OMP_NUM_THREADS=$PER timeout "${MEASURE_S:-470}" taskset -c "$cores" python3 benchmarks/search_efficiency_real.py \
    measure --out "$OUT/table-$k.json" --pairs "$PAIRS" --shard "$k/$SHARDS" "${SETS[@]}" > "$OUT/measure-$k.log" 2>&1 &
  pids+=($!)
  echo "shard $k/$SHARDS on cores $cores (pid $!)"
done
for p in "${pids[@]}"; do wait "$p"; echo "shard pid $p exited $?"; done
tail -n 3 "$OUT"/measure-*.log
for est in median mean; do
  python3 benchmarks/search_efficiency_real.py search --table "$OUT"/table-*.json --seeds 10 --budget 40 \
    --estimator "$est" --json "$OUT/results-$est.json" 2>&1 | tee "$OUT/search-$est.txt" | tail -n 14
done
