#!/usr/bin/env bash
# Issue 17's device run: a two-session `inferloom fleet` on the two-GPU H200 machine (kind nvidia-h200-x2),
# one session per GPU, both at once, one shared SQLite KB (one host: WAL on its local disk, BEGIN IMMEDIATE
# and a 30 s busy timeout serialize the two writers; a fleet over several hosts shares PostgreSQL instead,
# docs/fleet.md). Ray gives each GPU task its own CUDA_VISIBLE_DEVICES (num_gpus=1); the check at the end
# says whether the two sessions got different GPUs and overlapped in time.
#
# What travels (no registry on the device; its python3 is 3.12 with torch and transformers): Ray and the
# packages the image lacks, built here once by `bash benchmarks/ray_lean_bundle.sh` into .whl/ray (39 MiB:
# ray-lean.tar.xz, 29 MiB, is Ray 2.60.0's cp312 wheel unpacked without its Java jar and dashboard web UI;
# deps/, 9 MiB, cp312 wheels of jsonschema, pydantic, optuna, sqlalchemy, ...). One device call, from the
# repository root (~48 MiB with the ~9 MiB repository, under the 64 MiB a call carries):
#   kind nvidia-h200-x2, carry [".whl/ray"], timeout_s 600:
#     bash benchmarks/fleet_two_gpu.sh
# (ask `status` first: the kind is lent only at times; on any other kind the check fails, one GPU for two)
# About 8 minutes (estimated, not yet seen): unpack ~15 s, two model directories ~1 min, Ray ~10 s, the
# fleet ~6 min (3 trials each, then CLOSE; a 6-minute budget caps a slow session). The fleet is stopped (SIGINT: the driver stops its Ray and the
# session workers with it) so that the whole command ends by CALL_S (default 570 s) with its outputs
# written, or after FLEET_TIMEOUT seconds if given; a cut fleet resumes with the same command in the next call
# (back to back: the warm machine keeps /tmp; on a fresh machine, `tar xzf $OUT/fleet-cuda.tgz -C .gpu`
# here and carry ".gpu/fleet-cuda" too: the script copies its fleet directory back and resumes it).
#
# CPU dry run of the same steps (tiny shapes, float32, 2 CPU sessions at once; ray from the environment):
#   FLEET_DEVICE=cpu PY=.venv/bin/python bash benchmarks/fleet_two_gpu.sh
#
# Leaves under $OUT: fleet-<device>.log (progress, nvidia-smi samples every 10 s, the check),
# fleet-<device>-check.json (per session: status, trials, final ratio, CUDA_VISIBLE_DEVICES, start/end),
# fleet_report.html, fleet-<device>.tgz (the fleet directory: sessions, logs, KB; not the model weights),
# ray-logs-<device>.tgz (Ray's own logs: a worker that died before its session could say why).
set -uo pipefail
DEVICE=${FLEET_DEVICE:-cuda}
case "$DEVICE" in cuda|cpu) ;; *) echo "FLEET_DEVICE=$DEVICE: expected cuda or cpu"; exit 2;; esac
PY=${PY:-python3}
OUT=${OUT:-runs/fleet-two-gpu}; mkdir -p "$OUT"
LOG=$OUT/fleet-$DEVICE.log
WORK=${FLEET_WORK:-/tmp/fleet-$DEVICE}; mkdir -p "$WORK"
say() { echo "$(date +%T) $*" | tee -a "$LOG"; }
T0=$(date +%s)

# 1. Ray and the missing packages, from the carried bundle, into $SITE (kept while the machine is warm)
if ! "$PY" -c "import ray, pydantic, optuna, sqlalchemy, jsonschema" 2>/dev/null; then
  B=${RAY_BUNDLE:-.whl/ray} SITE=${SITE:-/tmp/fleet-site}
  if [ ! -f "$SITE/.complete" ]; then
    [ -f "$B/ray-lean.tar.xz" ] && [ -d "$B/deps" ] || {
      say "no $B/ray-lean.tar.xz or $B/deps: build them here with 'bash benchmarks/ray_lean_bundle.sh' and carry .whl/ray"
      exit 3; }
    (cd "$B" && sha256sum -c --quiet SHA256) || { say "$B/ray-lean.tar.xz: checksum failed: rebuild and carry it again"; exit 3; }
    rm -rf "$SITE" && mkdir -p "$SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$B"/deps/*.whl \
      || { say "pip could not install $B/deps into $SITE"; exit 3; }
    xz -dc -T0 "$B/ray-lean.tar.xz" | tar -x -C "$SITE" || { say "unpacking $B/ray-lean.tar.xz failed"; exit 3; }
    touch "$SITE/.complete"
  fi
  export PYTHONPATH=$SITE
  "$PY" -c "import ray, pydantic, optuna, sqlalchemy, jsonschema; print('ray', ray.__version__, 'from', ray.__file__)" \
    2>&1 | tee -a "$LOG" | grep -q "^ray " || { say "ray does not import from $SITE (above)"; exit 3; }
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export INFERLOOM_GIT_REVISION=${INFERLOOM_GIT_REVISION:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
# no dashboard, no usage report (nothing outside the machine can be reached); no Ray memory monitor: the
# device's MemTotal starts at ~31 GiB and grows as memory is used (KINDS.md), so Ray would see a near-full
# machine and kill a worker loading its model
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled} RAY_USAGE_STATS_ENABLED=0 RAY_memory_monitor_refresh_ms=0
# Ray's files (sockets, logs) in the run's own directory: its logs come back
export RAY_TMPDIR=$WORK/raytmp; mkdir -p "$RAY_TMPDIR"

# 2. Two model directories (two Llama shapes: two KB groups, so both sessions start at once)
MODELS=$("$PY" benchmarks/fleet_models.py --device "$DEVICE" --out "$WORK/models" 2>>"$LOG" | tail -1)
echo "$MODELS" | "$PY" -c "import json, sys; assert len(json.load(sys.stdin)) == 2" 2>/dev/null \
  || { say "writing the model directories failed (log above)"; exit 4; }
say "models: $MODELS ($(( $(date +%s) - T0 )) s since start)"
m() { echo "$MODELS" | "$PY" -c "import json, sys; print(list(json.load(sys.stdin).values())[$1])"; }

# 3. The fleet file: one base spec per device, the two models; a rerun must keep it byte-identical
FLEET=$WORK/fleet
# a fleet cut short on a machine that has since gone back: resume the carried copy ($OUT/fleet-DEVICE.tgz)
[ -f "$FLEET/fleet_plan.json" ] || { [ -d ".gpu/fleet-$DEVICE/fleet" ] && mkdir -p "$FLEET" && cp -r ".gpu/fleet-$DEVICE/fleet/." "$FLEET/"; }
if [ "$DEVICE" = cuda ]; then
  NGPU=2 NCPU=   # the embedded Ray takes the machine's CPUs; a GPU session asks for 1 CPU and 1 GPU
  SPEC="{framework: transformers, device: cuda, dtype: bfloat16, seed: 0,
    traffic: {concurrency: 32, input_len: 128, output_len: 64, num_prompts: 32},
    quality: {eval_prompts: 4, heldout_prompts: 4, prompt_len: 32, continuation_len: 16},
    protocol: {min_gain: 0.01, min_pairs: 4, max_pairs: 8}, kernels: {backend: none}}"
  # 3 trials is the binding limit (then CLOSE); 6 minutes only caps a slower session
  DEFAULTS="{budget_minutes: ${BUDGET_MIN:-6}, max_trials: ${MAX_TRIALS:-3}, cycles: 1, sweep: false}"
else
  NGPU=0 NCPU=2
  SPEC="{framework: transformers, device: cpu, dtype: float32, seed: 0,
    traffic: {concurrency: 4, input_len: 16, output_len: 8, num_prompts: 4},
    quality: {eval_prompts: 2, heldout_prompts: 2, prompt_len: 8, continuation_len: 4},
    protocol: {min_gain: 0.01, min_pairs: 3, max_pairs: 4}}"
  DEFAULTS="{budget_minutes: ${BUDGET_MIN:-1.5}, max_trials: ${MAX_TRIALS:-2}, cycles: 1, sweep: false,
    env: {OMP_NUM_THREADS: '1'}}"
fi
printf '%s\n' "$SPEC" > "$WORK/spec.yaml"
cat > "$WORK/fleet.yaml" <<YAML
order: all-at-once            # one session per GPU, at the same time
defaults: $DEFAULTS
sessions:
  - {name: a, workload: {spec: spec.yaml, set: {model: $(m 0)}}}
  - {name: b, workload: {spec: spec.yaml, set: {model: $(m 1)}}}
YAML
cat "$WORK/fleet.yaml" >> "$LOG"

# 4. The fleet, with GPU samples beside it
SAMPLER=
if [ "$DEVICE" = cuda ]; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv 2>&1 | tee -a "$LOG"
  ( while sleep 10; do nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader \
      | sed "s/^/$(date +%T) gpu /"; done ) >> "$LOG" 2>&1 &
  SAMPLER=$!
fi
LIMIT=${FLEET_TIMEOUT:-$(( ${CALL_S:-570} - ($(date +%s) - T0) - 40 ))}
say "fleet: starting, stopped after $LIMIT s if not done ($(( $(date +%s) - T0 )) s since start)"
# INFERLOOM_FLEET_RUN marks the driver and everything it starts (Ray's daemons and workers inherit it)
INFERLOOM_FLEET_RUN=$WORK timeout -s INT -k 25 "$LIMIT" "$PY" -m inferloom.cli fleet "$WORK/fleet.yaml" --out "$FLEET" \
  --kb "sqlite:///$FLEET/kb.sqlite" --num-gpus "$NGPU" ${NCPU:+--num-cpus "$NCPU"} 2>&1 | grep --line-buffered -v '^USDT' | tee -a "$LOG"
RC=${PIPESTATUS[0]}
[ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null
case "$RC" in 124|137) CUT=": stopped at the time limit; the same command again resumes it";; *) CUT=;; esac
say "fleet: exit $RC ($(( $(date +%s) - T0 )) s since start)$CUT"
# nothing of this run's Ray may outlive it (a worker still writing a session would race the next call's resume)
leftovers() { local e p; for e in /proc/[0-9]*/environ; do p=${e#/proc/}; p=${p%/environ}
  { tr '\0' '\n' < "$e"; } 2>/dev/null | grep -qxF "INFERLOOM_FLEET_RUN=$WORK" && echo "$p"; done; }
LEFT=$(leftovers | tr '\n' ' ')
[ -n "$LEFT" ] && { say "Ray processes left running: $LEFT: stopping them"; kill $LEFT 2>/dev/null; sleep 3; kill -9 $LEFT 2>/dev/null; }

# 5. The check, and what comes back
"$PY" benchmarks/fleet_check.py "$FLEET" --gpus "$NGPU" --out "$OUT/fleet-$DEVICE-check.json" 2>&1 | tee -a "$LOG"
CHECK=${PIPESTATUS[0]}
cp "$FLEET/fleet_report.html" "$OUT/" 2>/dev/null
# the session directories without quality_refs.pt (stock's reference logits, up to 4 MB each: an in-process
# engine's resume captures identical ones again), the model weights and Ray's sockets
tar czf "$OUT/fleet-$DEVICE.tgz" --exclude='*.pt' --exclude="$(basename "$WORK")/models" \
  --exclude="$(basename "$WORK")/raytmp" -C "$(dirname "$WORK")" "$(basename "$WORK")"
tar czf "$OUT/ray-logs-$DEVICE.tgz" -C "$RAY_TMPDIR/ray" session_latest/logs 2>/dev/null
ls -la "$OUT" | tee -a "$LOG"
[ "$RC" = 0 ] && exit "$CHECK" || exit "$RC"
