#!/usr/bin/env bash
# Issue 15 part (b) on a quiet machine: benchmarks/search_efficiency_real.py's `measure` on the device
# host's CPU cores (the GPU is not used), in SHARDS shards side by side, each pinned to its own cores
# with taskset and as many torch threads, then `search` over the shards (median and mean).
#
#   run(kind="nvidia-h200", carry=[".whl/py"], timeout_s=600,
#       command="INFERLOOM_GIT_REVISION=<sha> SUBSPACE=compile bash benchmarks/search_real_device.sh")
#
# The shards run detached (setsid): a call follows them for at most FOLLOW_S seconds, and when they are
# not done it says so: call again, back to back (the machine and /tmp go back after 30 s idle), and the
# next call follows the same shards. Once every shard has exited, `search` runs and everything is packed
# into $OUT/search-real.tgz ($OUT brings back at most 8 files).
# .whl/py: pydantic, optuna, sqlalchemy and their dependencies for Python 3.12 (the download is in
# benchmarks/gpu_vllm_session.sh's header). Env: SHARDS (4), PAIRS (7), SUBSPACE (default | compile),
# MEASURE_S (1000: each shard is cut there; its table keeps the rows measured so far), FOLLOW_S (530),
# SET (traffic overrides for `measure --set`), TABLES (/tmp/search-real).
set -uo pipefail
OUT=${OUT:-runs/search-real-device}; mkdir -p "$OUT"
T=${TABLES:-/tmp/search-real}; mkdir -p "$T"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false CUDA_VISIBLE_DEVICES=""
python3 -c "import pydantic, optuna, sqlalchemy" 2>/dev/null || PYTHONPATH=/tmp/site python3 -c "import optuna" 2>/dev/null || {
  w=$(ls .whl/py/*.whl 2>/dev/null); [ -n "$w" ] || { echo "no wheels in .whl/py: carry them (header)"; exit 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $w || exit 1; }
export PYTHONPATH=$PWD/src:/tmp/site
SHARDS=${SHARDS:-4}
if [ ! -f "$T/started" ]; then
  (lscpu; nproc; uptime) > "$T/machine.txt" 2>&1
  N=$(nproc); PER=$(( N / SHARDS )); [ "$PER" -ge 1 ] || { echo "SHARDS=$SHARDS is more than the $N cores"; exit 1; }
  SETS=(); for s in ${SET:-traffic.num_prompts=8 traffic.output_len=32}; do SETS+=(--set "$s"); done
  cp -r src benchmarks "$T/" # the shards read this copy: a later call's fresh working tree can't change them
  for k in $(seq 0 $((SHARDS - 1))); do
    cores="$((k * PER))-$((k * PER + PER - 1))"
    # its own session (setsid), so that the end of this call does not stop it; rc-K says it exited
    PYTHONPATH=$T/src:/tmp/site OMP_NUM_THREADS=$PER setsid bash -c 'cd "$1" && shift && timeout "$@"; echo $? > rc-'"$k" \
      _ "$T" "${MEASURE_S:-1000}" taskset -c "$cores" python3 benchmarks/search_efficiency_real.py measure \
      --out "$T/table-$k.json" --pairs "${PAIRS:-7}" --shard "$k/$SHARDS" --subspace "${SUBSPACE:-default}" \
      "${SETS[@]}" > "$T/measure-$k.log" 2>&1 < /dev/null &
    echo "shard $k/$SHARDS on cores $cores"
  done
  date -u +%FT%TZ > "$T/started"
fi
deadline=$(( SECONDS + ${FOLLOW_S:-530} ))
while [ "$(ls "$T"/rc-* 2>/dev/null | wc -l)" -lt "$SHARDS" ]; do
  if [ "$SECONDS" -ge "$deadline" ]; then
    tail -q -n 1 "$T"/measure-*.log; echo "shards still running: call again, back to back (this call's time is up)"; exit 0; fi
  sleep 10
done
for k in $(seq 0 $((SHARDS - 1))); do echo "shard $k exited $(cat "$T/rc-$k")"; tail -n 2 "$T/measure-$k.log"; done
for est in median mean; do
  python3 benchmarks/search_efficiency_real.py search --table "$T"/table-*.json --seeds 10 --budget 40 \
    --estimator "$est" --json "$T/results-$est.json" 2>&1 | tee "$T/search-$est.txt" | tail -n 14
done
tar czf "$OUT/search-real.tgz" -C "$T" --exclude=src --exclude=benchmarks . && ls -la "$OUT"
