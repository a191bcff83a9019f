# The device-session steps that the vLLM and SGLang session scripts share (sourced, not run):
# benchmarks/gpu_vllm_session.sh and benchmarks/gpu_sglang_session.sh set, before sourcing it:
#   ENGINE   the server's import name and label (vllm, sglang)
#   BUNDLE   the tar.xz's name without .tar.xz (lean-vllm, lean-sglang); its parts are BUNDLE.tar.xz.part-NN
#   PARTS    where the carried part folders cN lie in the repository (.whl/vllm, .whl/sglang)
#   VL SITE VPY   the staging folder for the parts, the unpacked site, the wrapper (python3 with SITE first)
#   PYPATH   the wrapper's PYTHONPATH (SITE, and for vLLM cutlass-dsl's packages before it)
#   DEFAULT_SPEC  the session's spec when SPEC is unset; REBUILD  the command that rebuilds the parts
#   OUT      where a step writes what comes back ($OUT of the device call)
# and the engine's own steps after it. SESSIONS (default /tmp/sessions) holds the sessions and detached jobs
# (NAME/, NAME.out, NAME.pid). Every function says what to run first when a step before it is missing.

SESSIONS=${SESSIONS:-/tmp/sessions}
# vLLM's warm-up JIT-compiles FlashInfer's top-k/top-p sampling kernel (nvcc on a fresh machine: run2's cold start
# spent 112 s silent after graph capture; s25's first start 95 s of engine init against 12-22 s for the later ones)
# though greedy requests never run it (vllm 0.26.0 v1/worker/gpu/sample/sampler.py: a batch with any greedy request
# takes the gumbel path), and every request inferloom sends is greedy. The sessions' manifests record the variable.
export VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}

assemble() {  # assemble LABEL NAME PARTROOT STAGE: copy the carried PARTROOT/cN/* into STAGE; once every part and
  # SHA256 are there, cat and sha256sum -c: 0 = STAGE/NAME.tar.xz is whole and checked, 3 = more parts to carry, 1 = error
  local label=$1 name=$2 root=$3 stage=$4 d
  mkdir -p "$stage"
  for d in "$root"/c[0-9]*; do [ -d "$d" ] && cp -n "$d"/* "$stage"/ && echo "$label: copied $d ($(du -sh "$d" | cut -f1))"; done
  local have; have=$(ls "$stage/$name".tar.xz.part-* 2>/dev/null | wc -l)
  if [ ! -f "$stage/SHA256" ]; then
    echo "$label: $have part(s) in $stage, SHA256 not yet (it comes with the last part): carry the next" \
         "part in the next call, back to back (the machine and /tmp go back after 30 s idle)"; return 3; fi
  local i=0 p; for p in "$stage/$name".tar.xz.part-*; do
    [ "$p" = "$stage/$name.tar.xz.part-$(printf %02d $i)" ] || {
      echo "$label: part $(printf %02d $i) missing in $stage (have: $(cd "$stage" && ls "$name".tar.xz.part-* 2>/dev/null | tr '\n' ' '))." \
           "The machine went back between calls: carry the part folders $root/c* again, one per call, back to back"; return 1; }
    i=$((i+1)); done
  (cd "$stage" && cat "$name".tar.xz.part-* > "$name.tar.xz" && sha256sum -c SHA256) || {
    rm -f "$stage/$name.tar.xz"; echo "$label: checksum failed: rebuild the parts ($REBUILD) and carry them again"; return 1; }
}

unpack() {  # unpack LABEL STAGE NAME: STAGE/NAME.tar.xz into SITE, then the staged files go
  local label=$1 stage=$2 name=$3
  mkdir -p "$SITE" && xz -dc -T"${XZ_THREADS:-8}" "$stage/$name.tar.xz" | tar -x -C "$SITE" || {
    echo "$label: unpacking failed"; return 1; }  # 8 of 16 cores: a detached job (tfbg) may be measuring
  rm -f "$stage/$name".tar.xz* "$stage/SHA256"
}

bundle() {
  if [ -x "$VPY" ] && "$VPY" -c "import $ENGINE" 2>/dev/null; then echo "bundle: $VPY already runs $ENGINE"; return 0; fi
  assemble bundle "$BUNDLE" "$PARTS" "$VL"; local rc=$?
  [ $rc -eq 3 ] && return 0; [ $rc -eq 0 ] || return 1
  unpack bundle "$VL" "$BUNDLE" || return 1
  printf '#!/bin/bash\nexport PYTHONPATH=%s\nexec python3 "$@"\n' "$PYPATH" > "$VPY"
  chmod +x "$VPY"
  "$VPY" -c "import $ENGINE; print('bundle: $ENGINE', $ENGINE.__version__, 'from', $ENGINE.__file__)" || {
    echo "bundle: $VPY does not import $ENGINE"; return 1; }
}

pywheels() {  # pydantic / optuna / sqlalchemy for inferloom itself (the image lacks them)
  PYTHONPATH=/tmp/site python3 -c "import pydantic, optuna, sqlalchemy" 2>/dev/null && return 0  # an earlier call
  local w; w=$(ls .whl/py/*.whl 2>/dev/null || ls .whl/*.whl 2>/dev/null)
  [ -n "$w" ] || { echo "session: no pydantic/optuna/sqlalchemy here and no wheels in .whl/py: carry .whl/py" \
                        "(see gpu_vllm_session.sh's header for the download)"; return 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $w || return 1
}

model() {
  PYTHONPATH=$PWD/src:/tmp/site python3 - <<'EOF' || return 1
import time
from inferloom.models.preset_dir import save_preset
from inferloom.models.tokenizer import cache_root
d = cache_root() / "server-models" / "llama-3.1-8b-seed0-bfloat16"  # server_launch.server_model_dir's path
if (d / "config.json").is_file():
    print(f"model: {d} already written")
else:
    t0 = time.perf_counter()
    save_preset("llama-3.1-8b", d, seed=0, dtype="bfloat16", device="cuda")
    print(f"model: wrote {d} in {time.perf_counter() - t0:.0f} s")
EOF
}

session_cmd() {  # the inferloom command line of session NAME: resume when its state is there, else optimize
  local dir=$1
  if [ -f "$dir/state.json" ]; then echo "resume $dir"; else
    echo "optimize ${SPEC:-$DEFAULT_SPEC} --budget-minutes ${BUDGET_MIN:-20} --max-trials ${MAX_TRIALS:-8} --out $dir ${OPTIMIZE_ARGS:-}"; fi
}

session() {
  local name=${1:?session NAME}
  [ -x "$VPY" ] || { echo "session: $VPY is missing: run the bundle step first (the header's bundle calls)"; return 1; }
  pywheels || return 1
  export PYTHONPATH=$PWD/src:/tmp/site
  local KB=${KB:-/tmp/inferloom-kb.sqlite}
  [ -f "$KB" ] || { [ -f ".gpu/$name/kb.sqlite" ] && cp ".gpu/$name/kb.sqlite" "$KB"; }
  export INFERLOOM_KB=$KB INFERLOOM_GIT_REVISION=${INFERLOOM_GIT_REVISION:-unknown}
  local dir=$SESSIONS/$name; mkdir -p "$SESSIONS"
  [ -d "$dir" ] || { [ -f ".gpu/$name/state.json" ] && cp -r ".gpu/$name" "$dir" && echo "session: resuming the carried copy"; }
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv | tee -a "$OUT/$name.log"
  local cmd; read -r -a cmd <<< "$(session_cmd "$dir")"
  # the call's whole time stays under CALL_S (default 560 of the 600 s limit): the bundle and model
  # steps of this call count, and 30 s are kept for SIGINT to stop the servers (inferloom's atexit)
  local left=$(( ${CALL_S:-560} - SECONDS - 30 )); local t=${SESSION_TIMEOUT:-540}; [ "$left" -lt "$t" ] && t=$left
  [ "$t" -ge 60 ] || { echo "session: only ${t} s left in this call: run the session in the next call"; return 0; }
  echo "session: inferloom ${cmd[*]} (cut at ${t} s; the next call resumes)" | tee -a "$OUT/$name.log"
  timeout -s INT -k 30 "$t" python3 -m inferloom.cli "${cmd[@]}" 2>&1 | tee -a "$OUT/$name.log"
  echo "exit: ${PIPESTATUS[0]} (124: cut by the timeout; resume with the same command)" | tee -a "$OUT/$name.log"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tee -a "$OUT/$name.log"  # should be empty
  cp "$KB" "$dir/kb.sqlite" 2>/dev/null
  tar czf "$OUT/$name.tgz" -C "$SESSIONS" "$name"
}

start() {  # the session as a detached process (setsid): it outlives this call while the machine stays warm,
  # so calls that follow it (back to back: `follow NAME`) cost no resume and no server restart
  local name=${1:?start NAME}
  [ -x "$VPY" ] || { echo "start: $VPY is missing: run the bundle step first (the header's bundle calls)"; return 1; }
  pywheels || return 1
  export PYTHONPATH=$PWD/src:/tmp/site
  local KB=${KB:-/tmp/inferloom-kb.sqlite}
  export INFERLOOM_KB=$KB INFERLOOM_GIT_REVISION=${INFERLOOM_GIT_REVISION:-unknown}
  local dir=$SESSIONS/$name; mkdir -p "$SESSIONS"
  running "$name" start && return 0
  [ -d "$dir" ] || { [ -f ".gpu/$name/state.json" ] && cp -r ".gpu/$name" "$dir" && echo "start: resuming the carried copy"; }
  local cmd; read -r -a cmd <<< "$(session_cmd "$dir")"
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv | tee -a "$OUT/$name.log"
  echo "start: inferloom ${cmd[*]} (detached; follow it with: follow $name)" | tee -a "$OUT/$name.log"
  detach "$name" python3 -m inferloom.cli "${cmd[@]}"
}

running() {  # true (and says so) when the detached job NAME still runs on this machine ($2: the step, for the line)
  local pid="$SESSIONS/$1.pid"
  [ -f "$pid" ] && kill -0 "$(cat "$pid")" 2>/dev/null && { echo "${2:-detach}: $1 runs already"; return 0; }
  return 1
}

detach() {  # CMD... as the detached job NAME (setsid, nohup: it outlives this call while the machine stays warm,
  # so later calls follow it back to back with no resume): output in $SESSIONS/NAME.out, pid in NAME.pid
  local name=${1:?detach NAME CMD...}; shift
  mkdir -p "$SESSIONS"
  : > "$SESSIONS/$name.out"  # before the job starts: a `follow` right after must find it (tail -f)
  setsid nohup "$@" >> "$SESSIONS/$name.out" 2>&1 < /dev/null &
  echo $! > "$SESSIONS/$name.pid"
}

follow() {  # print the detached job's output until it ends or this call's time is nearly up, then pack it
  local name=${1:?follow NAME}; local dir=$SESSIONS/$name
  [ -f "$dir.pid" ] || { echo "follow: nothing named $name was started on this machine (start it first;" \
                               "a machine given back took it along): going on"; return 0; }
  local left=$(( ${CALL_S:-570} - SECONDS )); [ "$left" -gt 5 ] || left=5
  timeout "$left" tail -n +1 --pid="$(cat "$dir.pid")" -f "$dir.out" | tee -a "$OUT/$name.log" | grep -v "^\s*$"
  if kill -0 "$(cat "$dir.pid")" 2>/dev/null; then echo "follow: $name still running: follow it again in the next call"
  else echo "follow: $name ended"; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; fi
  cp "${KB:-/tmp/inferloom-kb.sqlite}" "$dir/kb.sqlite" 2>/dev/null
  tar czf "$OUT/$name.tgz" -C "$SESSIONS" "$name"
}

left_s() {  # seconds this call may still use for a step of at most $1 s (CALL_S less what ran, 30 s to stop)
  local left=$(( ${CALL_S:-560} - SECONDS - 30 )); [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}
