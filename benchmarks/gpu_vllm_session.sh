#!/usr/bin/env bash
# Issue 13: an unattended `inferloom optimize` session of vLLM 0.26.0 on one H200
# (Llama-3.1-8B shape, random bf16 weights, c64 256 in / 128 out), resumable
# across the device's 10-minute call limit, and the runs around it.
#
#   bash benchmarks/gpu_vllm_session.sh STEP...     STEPs run in order:
#     bundle         copy the bundle part(s) this call carries (.whl/vllm/cN) into /tmp/vl; once every
#                    part and SHA256 are there, check, unpack into /tmp/vllm-site and write /tmp/vllm-py
#                    (exactly as ../shared/gpu/vllm-lean-bundle.sh says); a no-op when /tmp/vllm-py runs
#     wheels         install the carried .whl/py (pydantic, optuna, sqlalchemy) into /tmp/site for later calls
#                    (tfbg does it too; a call that carries a 48 MiB part has no room for .whl/py; c4 has)
#     model          write the llama-3.1-8b preset (seeded random bf16 weights, built on the GPU; config and
#                    tokenizer built locally) where the vLLM adapter looks for it; a no-op when written
#     start NAME     the session /tmp/sessions/NAME (optimize, or resume it) as a detached process
#     follow NAME    print a detached job (start, tfbg) until it ends or this call's time is nearly up;
#                    packs /tmp/sessions/NAME into $OUT/NAME.tgz and tees $OUT/NAME.log
#     chain NAME     issue 31 run 2: the jobs of $CHAIN (fp8: bench stock vs --quantization fp8 at c64; c1: an
#                    optimize at concurrency 1; trace: an optimize replaying TRACE_SPEC's trace; lgbench:
#                    benchmarks/loadgen_vs_vllm_bench.py on SmolLM2 at c64, LG_ROUNDS rounds) one after another, detached, into
#                    /tmp/sessions/NAME/<job>; `follow NAME` prints and packs it (no gap at a call's end)
#     session NAME   run, or resume, the session in the foreground for at most SESSION_TIMEOUT s
#     goodput NAME   `inferloom bench` of the goodput spec (Poisson arrivals at 45 req/s, ~85% of stock's
#                    saturation; TTFT 100 ms / TPOT 9 ms SLOs, inside stock's measured distribution): stock against the final stack of the session
#                    GOODPUT_FROM (default tput; its state.json), or an A/A of stock when nothing was kept;
#                    3 pairs; $OUT/NAME.json (~4.5 min: 2 server starts, warm compile cache)
#     profile NAME   a kernel-level profile of stock through vLLM's /start_profile../stop_profile, one wave
#                    of 64 requests ($OUT/NAME-profile.json; PROFILE_ARGS="--quantization fp8 --num-prompts 64"
#                    profiles fp8 weights; ~3 min with a warm compile cache)
#     tf NAME        same-day row: inferloom's best transformers-engine stack (static cache, reduce-overhead,
#                    triton_decode, static_loop; 6,437 tok/s on 2026-11-30), an A/A of 3 pairs through
#                    `inferloom bench` (examples/llama-3.1-8b-h200.yaml); /tmp/sessions/NAME/NAME.json
#     tfbg NAME      the same, detached (it needs no vLLM: it runs on the GPU while the bundle calls carry)
#     gates          issue 33: the vLLM plugin backend's gates on the 8B shape, each replacement raced as delivered and
#                    through out= (benchmarks/gpu_plugin_gates.py; needs only .whl/py, no vLLM; ~2-3 min)
#     smollm2        issue 31: the real SmolLM2-135M-Instruct. Copies the GGUF part(s) this call carries
#                    (.whl/gguf/cN) into /tmp/gg; once every part and SHA256 are there: cat, sha256sum -c,
#                    installs the carried gguf wheel into /tmp/site, and converts it once into $INFERLOOM_CACHE
#                    (default /tmp/inferloom-cache) with models/gguf.py's convert_gguf (what `inferloom models
#                    convert` runs; it needs no pydantic; ~35 s on the H200 host), printing the directory;
#                    `model: smollm2-135m-instruct` then resolves to it (examples/smollm2-h200-vllm.yaml).
#                    A no-op when converted.
#
# The lead calls it through the device's `run`, back to back (the machine goes back after 30 s idle,
# and /tmp with it). A call carries at most 64 MiB *with the repository* (about 10 MB), so the bundle
# travels in parts of 48 MiB, one per call (re-split from vllm-lean-bundle.sh's 60 MiB parts, below).
# The device plan (<= 27 device minutes with the machine's start; expected minutes in brackets):
#   call 1   carry [".whl/py"]               model tfbg tf                                      [2.5]
#            (machine start; the vLLM model directory; then the transformers row runs detached, ~3.5 min)
#   call 2-5 carry [".whl/vllm/cN"], N=0..3  bundle                                             [0.4 each]
#   call 6   carry [".whl/vllm/c4"]          bundle follow tf profile stock start tput follow tput   [9.5]
#            (unpacking with 8 xz threads beside the transformers row; the profile's stock server compiles
#            first, so the session's stock starts with a warm compile cache; with BUDGET_MIN=9 MAX_TRIALS=8
#            OPTIMIZE_ARGS=--no-sweep: trials stop at 9 min, CLOSE after)
#   call 7   (no carry)                      follow tput goodput gp                             [9.5]
#   call 8   (no carry)                      goodput gp                                         [4.5]
#            (only when call 7 said "goodput: only N s left": goodput runs when >= 300 s of a call are left)
#
# Issue 31, the real SmolLM2 on vLLM (SPEC=examples/smollm2-h200-vllm.yaml; no `model` step, no tf row).
# Sizes (2026-12-02): the repository travels with every call, 13.7 MiB (12.0 tracked + 1.7 untracked, of
# which 1.6 examples/real-model-cpu/texts-long.jsonl); .whl/gguf/c0 48.0 MiB (GGUF part-00), .whl/gguf/c1
# 45.9 MiB (part-01, SHA256, the gguf 0.19.0 wheel: converting needs only gguf, so it converts there),
# .whl/vllm/c0..c3 48.0 MiB each, .whl/vllm/c4 32.7 MiB (+ SHA256), .whl/py 8.7 MiB (with gguf). Each call
# <= 64 MiB: 61.7 / 59.6 / 61.7 (x4) / 55.1 with .whl/vllm/c4 + .whl/py. Expected minutes in brackets:
#   call 1   carry [".whl/gguf/c0"]                 smollm2                                    [1.5]
#            (machine start; copies GGUF part 00 into /tmp/gg)
#   call 2   carry [".whl/gguf/c1"]                 smollm2                                    [1.0]
#            (cat + sha256sum -c; gguf into /tmp/site; converted to bf16 in ~35 s into
#            /tmp/inferloom-cache/models/b179c952.../, which `model: smollm2-135m-instruct` names)
#   call 3-6 carry [".whl/vllm/cN"], N=0..3         bundle                                     [0.4 each]
#   call 7   carry [".whl/vllm/c4", ".whl/py"]      bundle smollm2 start s31 follow s31        [9.5]
#            (env SPEC=examples/smollm2-h200-vllm.yaml BUDGET_MIN=15 MAX_TRIALS=8 OPTIMIZE_ARGS=--no-sweep;
#            smollm2 only checks the conversion is there; trials stop at 15 min, CLOSE after)
#   call 8   (no carry)                             follow s31                                 [9.5]
#   call 9   (no carry, only if call 8 said "still running")  follow s31                      [<= 3]
#   (23-26 device minutes in all, <= 27; the session's own ~18 min are calls 7-9)
# Issue 31 run 2 (2026-12-02): the repository grew to 16.2 MiB, so the parts are 44 MiB (split -b 44M):
# .whl/gguf/c0..c2 (c2: 5.8 MiB + SHA256 + the gguf wheel), .whl/vllm/c0..c5 (c5: 4.7 MiB + SHA256):
#   calls 1-2 carry .whl/gguf/c0, c1: smollm2; calls 3-7 carry .whl/vllm/c0..c4: bundle; call 8 carries
#   .whl/vllm/c5 .whl/gguf/c2 .whl/py: CHAIN="fp8 c1 trace lgbench" bundle smollm2 chain r2 follow r2;
#   then `follow r2` until it ends.
# Each step that needs a step before it says so and what to run; `follow` of a job that isn't there says so.
# When the machine went back between calls, unpack the last $OUT/NAME.tgz into .gpu/ here (`tar xzf
# NAME.tgz -C .gpu`) and carry .gpu/NAME with `session NAME`: it resumes from that copy, but the bundle
# (calls 2-6) must be carried again (for issue 31's SmolLM2: .whl/gguf/c0, c1 with `smollm2` too).
#
# Here, once (repository root; .whl/ and .gpu/ are git-ignored):
#   bash ../shared/gpu/vllm-lean-bundle.sh /tmp/vl60         # 4 parts of 60 MiB, ~5 min; then 48 MiB parts:
#   cat /tmp/vl60/c*/lean-vllm.tar.xz.part-* > /tmp/lv.tar.xz && (cd /tmp && split -b 48M -d -a 2 lv.tar.xz p-) \
#     && i=0 && for f in /tmp/p-*; do mkdir -p .whl/vllm/c$i; mv $f .whl/vllm/c$i/lean-vllm.tar.xz.part-${f#/tmp/p-}; \
#     i=$((i+1)); done && cp /tmp/vl60/c3/SHA256 .whl/vllm/c$((i-1))/      # SHA256 names lean-vllm.tar.xz
#   for p in pydantic==2.14.4 pydantic_core==2.50.5 annotated-types typing-inspection "typing-extensions>=4.16" \
#            optuna sqlalchemy alembic colorlog Mako greenlet gguf==0.19.0; do
#     python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       -d .whl/py "$p"; done
#   # issue 31: the SmolLM2 GGUF (sha256 b179c952...10db53) in two parts; the gguf wheel beside the last
#   # (gguf's own needs, numpy pyyaml requests tqdm, are on the device)
#   G=$(.venv/bin/python -c "from inferloom.models.real import REAL_MODELS as M, download_gguf as d; import pathlib, \
#     tempfile; print(d(M['smollm2-135m-instruct'], pathlib.Path(tempfile.mkdtemp())))")   # pip download + RECORD check
#   mkdir -p .whl/gguf/c0 .whl/gguf/c1 && (cd "${G%/*}" && sha256sum "${G##*/}" > SHA256 && split -b 48M -d -a 2 \
#     "${G##*/}" "${G##*/}.part-") && mv "$G.part-00" .whl/gguf/c0/ && mv "$G.part-01" "${G%/*}/SHA256" .whl/gguf/c1/ \
#     && cp .whl/py/gguf-0.19.0-py3-none-any.whl .whl/gguf/c1/ && rm -rf "${G%/*}"
# Env: SPEC (default examples/llama-3.1-8b-h200-vllm.yaml), BUDGET_MIN (20), MAX_TRIALS (8),
# SESSION_TIMEOUT (540), OPTIMIZE_ARGS (e.g. --no-sweep), KB (/tmp/inferloom-kb.sqlite), CALL_S (560: the
# seconds of a call the steps may use), GOODPUT_SPEC, GOODPUT_FROM (tput), TF_SPEC, PROFILE_ARGS.
set -uo pipefail
OUT=${OUT:-runs/gpu-vllm-session}; mkdir -p "$OUT"
VL=${VL:-/tmp/vl} SITE=${SITE:-/tmp/vllm-site} VPY=${VPY:-/tmp/vllm-py}  # the bundle header's paths
ENGINE=vllm BUNDLE=lean-vllm PARTS=.whl/vllm PYPATH=$SITE/nvidia_cutlass_dsl/dsl_packages:$SITE
DEFAULT_SPEC=examples/llama-3.1-8b-h200-vllm.yaml REBUILD=../shared/gpu/vllm-lean-bundle.sh
# bundle, wheels (pywheels), model, session, start, follow, left_s: shared with the SGLang session script
source "$(dirname "$0")/gpu_session_lib.sh"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# inferloom's cache (converted models, server model directories) in /tmp, for every step alike
export INFERLOOM_CACHE=${INFERLOOM_CACHE:-/tmp/inferloom-cache}
GG=${GG:-/tmp/gg} GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
SMOL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  # models/real.py's recorded sha256



smollm2() {  # the real SmolLM2-135M-Instruct: GGUF parts -> /tmp/gg -> checked -> converted into the cache
  local dir=$INFERLOOM_CACHE/models/$SMOL_SHA
  if [ -f "$dir/config.json" ] && grep -q "$SMOL_SHA" "$dir/.inferloom-source.json" 2>/dev/null; then
    echo "smollm2: converted already: $dir"; return 0; fi
  mkdir -p "$GG"
  if [ ! -f "$GG/$GGUF" ]; then  # (an earlier call may have assembled it)
    for d in .whl/gguf/c*; do [ -d "$d" ] && cp -n "$d"/* "$GG"/ && echo "smollm2: copied $d ($(du -sh "$d" | cut -f1))"; done
    local have; have=$(ls "$GG/$GGUF".part-* 2>/dev/null | wc -l)
    if [ "$have" -eq 0 ]; then
      echo "smollm2: no GGUF part in $GG and none carried: carry .whl/gguf/c0, then .whl/gguf/c1, back to back" \
           "(a machine given back took the earlier ones, and the conversion, along)"; return 1; fi
    if [ ! -f "$GG/SHA256" ]; then
      echo "smollm2: $have GGUF part(s) in $GG, SHA256 not yet (it comes with the last part): carry the next" \
           "part (.whl/gguf/cN) in the next call, back to back"; return 0; fi
    local i=0; for p in "$GG/$GGUF".part-*; do
      [ "$p" = "$GG/$GGUF.part-$(printf %02d $i)" ] || {
        echo "smollm2: GGUF part $(printf %02d $i) missing in $GG (have: $(cd "$GG" && ls "$GGUF".part-* 2>/dev/null | tr '\n' ' '))." \
             "The machine went back between calls: carry .whl/gguf/c0 and c1 again, back to back"; return 1; }
      i=$((i+1)); done
    (cd "$GG" && cat "$GGUF".part-* > "$GGUF" && sha256sum -c SHA256) || {
      rm -f "$GG/$GGUF"*; echo "smollm2: checksum failed (the parts are removed): rebuild .whl/gguf (this script's header) and carry c0 and c1 again"; return 1; }
    rm -f "$GG/$GGUF".part-*
  fi
  # converting needs the gguf package (its wheel rides with the last GGUF part, and in .whl/py), not
  # pydantic & co.: the function `inferloom models convert` calls (models/gguf.py) imports without them
  if ! PYTHONPATH=/tmp/site python3 -c "import gguf" 2>/dev/null; then
    local w; w=$(ls "$GG"/gguf-*.whl .whl/py/gguf-*.whl 2>/dev/null | head -1)
    [ -n "$w" ] || { echo "smollm2: no gguf in /tmp/site nor a gguf wheel here: carry .whl/gguf/c1 or .whl/py"; return 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$w" || return 1
  fi
  local t0=$SECONDS out
  out=$(PYTHONPATH=$PWD/src:/tmp/site python3 -c "import sys; from inferloom.models.gguf import convert_gguf
print(convert_gguf(sys.argv[1]))" "$GG/$GGUF") || { echo "smollm2: converting $GG/$GGUF failed"; return 1; }
  echo "smollm2: converted in $((SECONDS - t0)) s: $out"
  [ "$out" = "$dir" ] || { echo "smollm2: expected $dir (models/real.py's sha256), got $out"; return 1; }
  python3 -c "import json, sys; c = json.load(open(sys.argv[1])); print('smollm2:', c['architectures'], c['num_hidden_layers'],
'layers, hidden', c['hidden_size'], 'vocab', c['vocab_size'])" "$dir/config.json"
}






profile() {  # a kernel-level profile of stock through vLLM's own profiler (benchmarks/vllm_profile_stock.py)
  local name=${1:?profile NAME}
  [ -x "$VPY" ] || { echo "profile: $VPY is missing: run the bundle step first"; return 1; }
  pywheels || return 1
  local t; t=$(left_s "${PROFILE_TIMEOUT:-480}")
  [ "$t" -ge 150 ] || { echo "profile: only ${t} s left in this call: run it in the next call"; return 0; }
  PYTHONPATH=$PWD/src:/tmp/site timeout -s INT -k 30 "$t" python3 benchmarks/vllm_profile_stock.py \
    "${SPEC:-examples/llama-3.1-8b-h200-vllm.yaml}" --out "$OUT/$name-profile.json" ${PROFILE_ARGS:---num-prompts 64} \
    2>&1 | tee -a "$OUT/$name.log"
}

goodput() {  # stock against the tput session's final stack under the goodput objective (an A/A if none was kept)
  local name=${1:?goodput NAME}
  [ -x "$VPY" ] || { echo "goodput: $VPY is missing: run the bundle step first"; return 1; }
  pywheels || return 1
  local t; t=$(left_s "${GOODPUT_TIMEOUT:-480}")
  [ "$t" -ge 300 ] || { echo "goodput: only ${t} s left in this call: run it in the next call"; return 0; }
  local args; args=$(candidate_args "$SESSIONS/${GOODPUT_FROM:-tput}/state.json")
  echo "goodput: inferloom bench ${GOODPUT_SPEC:-examples/llama-3.1-8b-h200-vllm-goodput.yaml} $args (cut at ${t} s)" \
    | tee -a "$OUT/$name.log"
  PYTHONPATH=$PWD/src:/tmp/site INFERLOOM_GIT_REVISION=${INFERLOOM_GIT_REVISION:-unknown} timeout -s INT -k 30 "$t" \
    python3 -m inferloom.cli bench "${GOODPUT_SPEC:-examples/llama-3.1-8b-h200-vllm-goodput.yaml}" $args \
    --min-pairs 3 --max-pairs 3 --out "$OUT/$name.json" --force 2>&1 | tee -a "$OUT/$name.log"
  echo "exit: ${PIPESTATUS[0]}" | tee -a "$OUT/$name.log"
}

candidate_args() {  # `--candidate k=v` for each knob where a session's final stack differs from its stock; else --aa
  python3 - "$1" <<'GP'
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    print("--aa")
    sys.exit(0)
changed = {k: v for k, v in s["stack"].items() if s["stock_config"].get(k) != v}
print(" ".join(f"--candidate {k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in changed.items()) or "--aa")
GP
}

tf() {  # same-day row: inferloom's best transformers-engine stack, an A/A of 3 pairs (FACTS.md: 6,437 tok/s)
  local name=${1:?tf NAME}; local dir=$SESSIONS/$name; mkdir -p "$dir"
  pywheels || return 1
  export INFERLOOM_KERNEL_CACHE=${INFERLOOM_KERNEL_CACHE:-/tmp/inferloom-kcache}  # the catalog's H200 tuning
  mkdir -p "$INFERLOOM_KERNEL_CACHE/kernel_tuning"
  for f in docs/results/h200-kernels-*/tuning-*.json; do
    [ -f "$f" ] && cp -n "$f" "$INFERLOOM_KERNEL_CACHE/kernel_tuning/${f##*/tuning-}"; done
  { date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; } \
    2>&1 | tee -a "$dir/$name.log"
  PYTHONPATH=$PWD/src:/tmp/site INFERLOOM_GIT_REVISION=${INFERLOOM_GIT_REVISION:-unknown} timeout -s INT -k 30 \
    "${TF_TIMEOUT:-480}" python3 -m inferloom.cli bench "${TF_SPEC:-examples/llama-3.1-8b-h200.yaml}" \
    --pin cache_implementation=static --pin compile_mode=reduce-overhead --pin attention_kernel=triton_decode \
    --pin decode_loop=static_loop --aa --min-pairs 3 --max-pairs 3 --out "$dir/$name.json" --force 2>&1 \
    | tee -a "$dir/$name.log"
  echo "exit: ${PIPESTATUS[0]}" | tee -a "$dir/$name.log"
  cp "$dir/$name.json" "$OUT/" 2>/dev/null; return 0
}

tfbg() {  # tf, detached: it needs no vLLM, so it runs while the next calls carry the bundle; then `follow NAME`
  local name=${1:?tfbg NAME}; local dir=$SESSIONS/$name
  running "$name" tfbg && return 0
  pywheels || return 1  # here, while this call carries .whl/py
  detach "$name" env OUT="$dir" bash "$0" tf "$name"; echo "tfbg: $name detached (follow it with: follow $name)"
}

chainrun() {  # (detached by `chain`) the jobs of $CHAIN one after another into /tmp/sessions/NAME/<job>
  local name=${1:?chainrun NAME}; local root=$SESSIONS/$name; mkdir -p "$root"
  export PYTHONPATH=$PWD/src:/tmp/site INFERLOOM_KB=${KB:-/tmp/inferloom-kb.sqlite}
  export INFERLOOM_GIT_REVISION=${INFERLOOM_GIT_REVISION:-unknown}
  local job t0
  [ -n "${CHAIN:-}" ] || { echo "chain: set CHAIN to the jobs, e.g. CHAIN='fp8 c1 trace lgbench'"; return 1; }
  for job in $CHAIN; do
    t0=$SECONDS; echo "chain: $job starts at $(date -u +%H:%M:%S)"
    case "$job" in
      fp8)    # the fp8 verdict on the trained model at c64: stock (bf16) against --quantization fp8, with quality
              python3 -m inferloom.cli bench "${SPEC:-examples/smollm2-h200-vllm.yaml}" --candidate quantization=fp8 \
                --min-pairs 3 --max-pairs "${FP8_PAIRS:-5}" --out "$root/fp8.json" --force;;
      c1)     # an unattended session at concurrency 1 (8 requests per run, ~2.6 s at stock's 394 tok/s)
              python3 -m inferloom.cli optimize "${SPEC:-examples/smollm2-h200-vllm.yaml}" --concurrency 1 \
                --num-prompts "${C1_PROMPTS:-8}" --budget-minutes "${C1_MIN:-6}" --max-trials 8 --no-sweep \
                --out "$root/c1";;
      trace)  # an unattended session replaying the bursty trace (goodput under TTFT/TPOT SLOs)
              python3 -m inferloom.cli optimize "${TRACE_SPEC:-examples/smollm2-h200-trace.yaml}" \
                --budget-minutes "${TRACE_MIN:-6}" --max-trials 8 --no-sweep --out "$root/trace";;
      lgbench) # inferloom's load generator against `vllm bench serve` on one server (issue 31 item 4)
              python3 benchmarks/loadgen_vs_vllm_bench.py --python "$VPY" --model smollm2-135m-instruct --device cuda \
                --concurrency 64 --input-len 256 --output-len 128 --num-prompts 192 --rounds "${LG_ROUNDS:-4}" \
                --server-args "--gpu-memory-utilization 0.28 --kv-cache-memory-bytes 8589934592" \
                --out "$root/lgbench.json";;
      *)      echo "chain: unknown job $job (expected fp8, c1, trace, lgbench)";;
    esac
    echo "chain: $job exit $? after $((SECONDS - t0)) s"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader  # should be empty between jobs
  done
  cp "$INFERLOOM_KB" "$root/kb.sqlite" 2>/dev/null; echo "chain: done"
}

chain() {  # the jobs of $CHAIN, detached, back to back with no gap at a call's end; `follow NAME` prints it
  local name=${1:?chain NAME}
  [ -x "$VPY" ] || { echo "chain: $VPY is missing: run the bundle step first"; return 1; }
  running "$name" chain && return 0
  pywheels || return 1
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv | tee -a "$OUT/$name.log"
  echo "chain: $CHAIN (detached; follow it with: follow $name)" | tee -a "$OUT/$name.log"
  detach "$name" bash "$0" chainrun "$name"
}

gates() {  # the plugin backend's gates on the 8B shape, raced both ways (benchmarks/gpu_plugin_gates.py; no vLLM
  # needed: stock's op is vLLM's native composition under inductor): $OUT/plugin-gates-{compiled,eager}.json (~2-3 min)
  pywheels || return 1
  PYTHONPATH=$PWD/src:/tmp/site timeout "$(left_s 240)" python3 benchmarks/gpu_plugin_gates.py \
    --out "$OUT/plugin-gates-compiled.json" 2>&1 | grep -v Warning
  PYTHONPATH=$PWD/src:/tmp/site timeout "$(left_s 120)" python3 benchmarks/gpu_plugin_gates.py --eager \
    --out "$OUT/plugin-gates-eager.json" 2>&1 | grep -v Warning
}

[ $# -gt 0 ] || { sed -n '2,30p' "$0"; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    bundle) bundle || exit 1; shift;;
    model) model || exit 1; shift;;
    smollm2) smollm2 || exit 1; shift;;
    wheels) pywheels || exit 1; echo "wheels: /tmp/site has pydantic, optuna, sqlalchemy"; shift;;
    session) session "${2:-}" || exit 1; shift 2;;
    profile) profile "${2:-}" || exit 1; shift 2;;
    goodput) goodput "${2:-}" || exit 1; shift 2;;
    tf) tf "${2:-}" || exit 1; shift 2;;
    tfbg) tfbg "${2:-}" || exit 1; shift 2;;
    start) start "${2:-}" || exit 1; shift 2;;
    chain) chain "${2:-}" || exit 1; shift 2;;
    chainrun) chainrun "${2:-}"; exit $?;;
    follow) follow "${2:-}" || exit 1; shift 2;;
    gates) gates || exit 1; shift;;
    *) echo "unknown step '$1': expected bundle, wheels, model, smollm2, gates, session NAME, start NAME, follow NAME," \
            "profile NAME, goodput NAME, tf NAME, tfbg NAME or chain NAME"; exit 2;;
  esac
done
