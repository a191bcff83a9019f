#!/usr/bin/env bash
# Issue 32: an unattended `inferloom optimize` session of SGLang 0.5.17 on one H200 (Llama-3.1-8B shape,
# random bf16 weights, c64 256 in / 128 out: examples/sglang-h200/llama-3.1-8b-h200-sglang.yaml), resumable
# across the device's 10-minute call limit, and the same-day stock vLLM row. Run on the H200 twice on 2026-12-05
# (bundle, wheels, model, check, help, start, follow: docs/benchmarks.md section 22; vbundle, vstart and the start
# of engines: section 23; docs/sglang.md has what the runs taught and the next session's plan); vllm-row and a
# whole engines run have not run there yet.
#
#   bash benchmarks/gpu_sglang_session.sh STEP...     STEPs run in order:
#     bundle         copy the part(s) this call carries (.whl/sglang/cN; benchmarks/sglang_lean_bundle.sh builds
#                    them) into /tmp/sgl; once every part and SHA256 are there, check, unpack into /tmp/sglang-site
#                    and write /tmp/sglang-py; the FA3 add-on's parts (.whl/sglang/fa3/cN, optional) likewise into
#                    /tmp/sgl/fa3, unpacked over the site when whole. A no-op when /tmp/sglang-py runs sglang
#     check          import the server's closure (HTTP server, scheduler, model runner, Llama, triton attention,
#                    sampler, sgl_kernel's sm90 ops) with /tmp/sglang-py; names each missing module
#                    ($OUT/sglang-import-check.txt): add its wheel to benchmarks/sglang-0.5.17-lean-deps.txt
#     help           `python -m sglang.launch_server --help` of the bundle into $OUT/sglang-0.5.17-help-h200.txt
#                    (tests/data/sglang/ holds the one captured on 2026-12-05; ~30-60 s)
#     wheels         install the carried .whl/py (pydantic, optuna, sqlalchemy) into /tmp/site for inferloom itself
#     model          write the llama-3.1-8b preset (seeded random bf16 weights, built on the GPU) where the server
#                    adapters look for it (the same directory as the vLLM session's); a no-op when written
#     start NAME     the session /tmp/sessions/NAME (optimize, or resume it) as a detached process; without the
#                    FA3 add-on it pins attention_backend=triton (OPTIMIZE_ARGS gets --pin attention_backend=triton)
#     plan NAME      print the inferloom command `start NAME` would run (the pin included), run nothing
#     follow NAME    print a detached job until it ends or this call's time is nearly up; packs $OUT/NAME.tgz
#     session NAME   run, or resume, the session in the foreground for at most SESSION_TIMEOUT s
#     profile NAME   a kernel-level profile of stock SGLang through its /start_profile../stop_profile
#                    (benchmarks/vllm_profile_stock.py, which picks the adapter by the spec's framework;
#                    $OUT/NAME-profile.json; ~3 min)
#     vbundle        the vLLM bundle's step (gpu_vllm_session.sh bundle: .whl/vllm/cN, one per call)
#     vstart NAME    a short vLLM session of the same workload (VLLM_SPEC, VBUDGET_MIN=3, VMAX_TRIALS=2), detached
#                    (gpu_vllm_session.sh start): the vLLM side of `engines`; `follow NAME` prints it
#     engines NAME A B  `inferloom engines /tmp/sessions/A /tmp/sessions/B --trust-session` (ENGINE_PAIRS=5),
#                    detached, into /tmp/sessions/NAME; `follow NAME` prints and packs it. A or B with a / is a
#                    session's path (e.g. a published one carried in the repository: docs/results/.../sg)
#     vllm-row NAME  same-day stock vLLM row: `inferloom bench` A/A of stock vLLM (3 pairs) on the same workload
#                    (examples/llama-3.1-8b-h200-vllm.yaml), detached; `follow NAME` prints it (~4.5 min)
#
# A call carries at most 64 MiB with the repository (19.2 MiB tracked on 2026-12-04), so the bundle travels in
# parts of 40 MiB, one per call, back to back (the machine goes back after 30 s idle, and /tmp with it).
# Measured here on 2026-12-04 (benchmarks/sglang_lean_bundle.sh's header): lean-sglang.tar.xz 68.7 MiB = .whl/sglang/c0
# (40.0 MiB) + c1 (28.7 MiB + SHA256); .whl/py (pydantic, optuna, sqlalchemy; gpu_vllm_session.sh's header) 8.7 MiB.
# Per call: 59.2 MiB (c0), 56.6 MiB (c1 + .whl/py). The device plan for the next session (expected minutes in
# brackets; <= 25 device minutes with the machine's start); env for every call:
#   SPEC=examples/sglang-h200/llama-3.1-8b-h200-sglang.yaml BUDGET_MIN=15 MAX_TRIALS=8 OPTIMIZE_ARGS=--no-sweep
#   call 1   carry [".whl/sglang/c0"]              bundle                                       [1.5]
#            (machine start ~1 min; part 00 into /tmp/sgl)
#   call 2   carry [".whl/sglang/c1", ".whl/py"]   bundle wheels model check help start sg follow sg   [9.5]
#            (part 01 + SHA256: check, unpack ~20 s, /tmp/sglang-py; pydantic & co. into /tmp/site; the model
#            directory built on the GPU ~40 s; the import check ~30 s; --help ~40 s; then the session starts
#            detached (attention_backend pinned to triton: no FA3) and this call follows it)
#   call 3   (no carry)                            follow sg                                    [9.5]
#   call 4   (no carry, only if call 3 said "still running")  follow sg                        [<= 3]
#   (~21-24 device minutes; the session's own 15 min + CLOSE are calls 2-4, the first server start included)
# Optional, after it (beyond the 25 minutes; the machine still warm): vLLM's row of the same day and machine,
# six calls carrying .whl/vllm/c0..c5 (gpu_vllm_session.sh's header) with `vbundle` [0.4 each], the last with
# .whl/py too: `vbundle vllm-row vr follow vr` [5]; and `profile sp` [3]. SGLang's real default (FA3) needs the
# add-on: .whl/sglang/fa3/c0..c3 (40, 40, 40, 2.2 MiB) carried with `bundle`, one per call, before `start` (c3 fits
# beside call 2's carry: 58.8 MiB; so 3 more calls of ~0.4 min, between calls 1 and 2).
# If a call's import check names a missing module: add its wheel to the deps file, rebuild, carry again.
# When the machine went back between calls: unpack the last $OUT/NAME.tgz into .gpu/ here (`tar xzf NAME.tgz
# -C .gpu`), carry the bundle parts again (calls 1-2) and .gpu/NAME with `start NAME`: it resumes from that copy.
#
# Env: SPEC, BUDGET_MIN (20), MAX_TRIALS (8), SESSION_TIMEOUT (540), OPTIMIZE_ARGS, KB (/tmp/inferloom-kb.sqlite),
# CALL_S (560: the seconds of a call the steps may use), VLLM_SPEC, PROFILE_ARGS.
set -uo pipefail
OUT=${OUT:-runs/gpu-sglang-session}; mkdir -p "$OUT"
VL=${VL:-/tmp/sgl} SITE=${SITE:-/tmp/sglang-site} VPY=${VPY:-/tmp/sglang-py}
ENGINE=sglang BUNDLE=lean-sglang PARTS=.whl/sglang PYPATH=$SITE
DEFAULT_SPEC=examples/sglang-h200/llama-3.1-8b-h200-sglang.yaml REBUILD=benchmarks/sglang_lean_bundle.sh
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export INFERLOOM_CACHE=${INFERLOOM_CACHE:-/tmp/inferloom-cache}
HERE=$(cd "$(dirname "$0")" && pwd)
# bundle, wheels (pywheels), model, session, start, follow, left_s: shared with the vLLM session script
source "$HERE/gpu_session_lib.sh"
#: the modules a server start imports (the static closure the bundle was built from), sgl_kernel's ops last
CHECK_MODULES="sglang.srt.entrypoints.http_server sglang.srt.managers.scheduler sglang.srt.managers.detokenizer_manager
sglang.srt.model_executor.model_runner sglang.srt.models.llama sglang.srt.layers.attention.triton_backend
sglang.srt.layers.sampler sgl_kernel"

lean_fixups() {  # sgl_kernel's rmsnorm prefers flashinfer's, a JIT module (nvcc and flashinfer/data/csrc, neither in the
  # lean bundle: the first H200 start, 2026-12-05, died in CUDA-graph capture on "norm.cu missing"); without
  # flashinfer.norm it runs its own compiled kernel (sgl_kernel common_ops), which the bundle has
  local f=$SITE/sgl_kernel/elementwise.py
  [ -f "$f" ] || return 0
  if grep -q "^    import flashinfer.norm as _flashinfer_norm$" "$f"; then
    sed -i 's/^    import flashinfer.norm as _flashinfer_norm$/    raise ImportError("lean bundle: flashinfer.norm needs its JIT sources, dropped")/' "$f" &&
      echo "bundle: sgl_kernel's rmsnorm uses its own kernel (flashinfer's JIT norm: its sources are not in the bundle)"
  fi
  cuda_home
}

cuda_home() {  # SGLang 0.5.17 builds its rope and activation kernels at first use (tvm-ffi JIT: nvcc, ninja, g++);
  # the image has nvcc 13.0 (KINDS.md), maybe off PATH or in pip's layout (lib, not lib64): the wrapper gets a
  # CUDA_HOME that has bin, include, lib64 and nvvm
  local nv; nv=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || python3 - <<'PY'
import importlib.util, os
s = importlib.util.find_spec("nvidia")
for p in (s.submodule_search_locations if s else []):
    for v in ("cu13", "cu12", "cuda_nvcc"):
        f = os.path.join(p, v, "bin", "nvcc")
        if os.path.exists(f):
            print(f); raise SystemExit
PY
  )
  [ -n "$nv" ] || { echo "bundle: no nvcc on this machine: SGLang's JIT kernels (rope, activation) cannot build"; return 0; }
  local top; top=$(cd "$(dirname "$nv")/.." && pwd)
  if [ ! -d "$top/lib64" ] && [ -d "$top/lib" ]; then
    # nvcc finds its tree from its own real path: bin is copied (~110 MiB), the rest linked
    mkdir -p /tmp/cuda-home && for d in "$top"/*; do [ "${d##*/}" = bin ] || ln -sfn "$d" /tmp/cuda-home/; done
    [ -d /tmp/cuda-home/bin ] || cp -r "$top/bin" /tmp/cuda-home/bin
    ln -sfn "$top/lib" /tmp/cuda-home/lib64; top=/tmp/cuda-home; fi
  grep -q CUDA_HOME "$VPY" 2>/dev/null ||
    sed -i "2i export CUDA_HOME=$top PATH=$top/bin:\$PATH" "$VPY"
  echo "bundle: nvcc $nv ($("$nv" --version | tail -2 | head -1)); the wrapper sets CUDA_HOME=$top"
}

fa3_addon() {  # the optional FA3 add-on (sgl_kernel/flash_ops.abi3.so), carried as .whl/sglang/fa3/cN
  [ -f "$SITE/sgl_kernel/flash_ops.abi3.so" ] && { echo "fa3: in $SITE already"; return 0; }
  ls -d "$PARTS"/fa3/c[0-9]* > /dev/null 2>&1 || ls "$VL"/fa3/fa3-sglang.tar.xz.part-* > /dev/null 2>&1 || return 0
  assemble fa3 fa3-sglang "$PARTS/fa3" "$VL/fa3"; local rc=$?
  [ $rc -eq 3 ] && return 0; [ $rc -eq 0 ] || return 1
  [ -d "$SITE/sgl_kernel" ] || { echo "fa3: whole, but the lean bundle is not unpacked yet: it stays in $VL/fa3"; return 0; }
  unpack fa3 "$VL/fa3" fa3-sglang && echo "fa3: $SITE/sgl_kernel/flash_ops.abi3.so ($(du -sh "$SITE/sgl_kernel/flash_ops.abi3.so" | cut -f1))"
}

check() {  # import the server's closure in one process (torch once); each missing module on its own line
  [ -x "$VPY" ] || { echo "check: $VPY is missing: run the bundle step first"; return 1; }
  local t0=$SECONDS mods=$CHECK_MODULES
  [ -f "$SITE/sgl_kernel/flash_ops.abi3.so" ] && mods="$mods sgl_kernel.flash_attn"  # the FA3 add-on loads
  (cd / && "$VPY" - $mods <<'PY'
import importlib, importlib.metadata as md, sys
bad = 0
for m in sys.argv[1:]:
    try:
        importlib.import_module(m)
        print(f"check: import {m} ok")
    except Exception as exc:  # noqa: BLE001 - each failure is a line to read, the next module still checked
        bad += 1
        print(f"check: import {m} FAILED: {type(exc).__name__}: {exc}")
try:
    import torch, transformers
    print("check: torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__,
          "sglang", md.version("sglang"), "sglang-kernel", md.version("sglang-kernel"))
except Exception as exc:  # noqa: BLE001
    print(f"check: versions unreadable: {type(exc).__name__}: {exc}")
if bad:
    print("check: add each failing import's wheel to benchmarks/sglang-0.5.17-lean-deps.txt, rebuild"
          " (benchmarks/sglang_lean_bundle.sh) and carry the parts again")
PY
  ) 2>&1 | tee "$OUT/sglang-import-check.txt" | grep -v "^\s*$"
  echo "check: $((SECONDS - t0)) s"
  return 0  # a missing module is for the next build; the session's own start will say the same
}

help_capture() {  # the bundle's real --help, for tests/data/sglang/
  [ -x "$VPY" ] || { echo "help: $VPY is missing: run the bundle step first"; return 1; }
  local t0=$SECONDS
  (cd / && timeout 300 "$VPY" -m sglang.launch_server --help) > "$OUT/sglang-0.5.17-help-h200.txt" 2> "$OUT/sglang-help.err"
  echo "help: exit $?, $(wc -l < "$OUT/sglang-0.5.17-help-h200.txt") lines in $((SECONDS - t0)) s: $OUT/sglang-0.5.17-help-h200.txt"
}

lean_pin() {  # without FA3 (SGLang's Hopper default) the stock server must be told its attention backend
  if [ -f "$SITE/sgl_kernel/flash_ops.abi3.so" ]; then return 0; fi
  case " ${OPTIMIZE_ARGS:-} " in *attention_backend=*) ;; *)
    OPTIMIZE_ARGS="${OPTIMIZE_ARGS:-} --pin attention_backend=triton"
    echo "start: no FA3 in the lean bundle: --pin attention_backend=triton (stock = SGLang with triton attention)";; esac
  export OPTIMIZE_ARGS
}

profile() {  # stock through SGLang's own profiler (measure/server_profile.py's SGLang way)
  local name=${1:?profile NAME}
  [ -x "$VPY" ] || { echo "profile: $VPY is missing: run the bundle step first"; return 1; }
  pywheels || return 1
  local t; t=$(left_s "${PROFILE_TIMEOUT:-480}")
  [ "$t" -ge 150 ] || { echo "profile: only ${t} s left in this call: run it in the next call"; return 0; }
  local pin=""; [ -f "$SITE/sgl_kernel/flash_ops.abi3.so" ] || pin="--set attention_backend=triton"  # lean_pin's
  PYTHONPATH=$PWD/src:/tmp/site timeout -s INT -k 30 "$t" python3 benchmarks/vllm_profile_stock.py \
    "${SPEC:-$DEFAULT_SPEC}" --out "$OUT/$name-profile.json" --traces /tmp/sglang-traces $pin \
    ${PROFILE_ARGS:---num-prompts 64} 2>&1 | tee -a "$OUT/$name.log"
}

vllm_row() {  # stock vLLM, an A/A of 3 pairs, same workload, same day and machine (detached; `follow NAME`)
  local name=${1:?vllm-row NAME}; local dir=$SESSIONS/$name; mkdir -p "$dir"
  [ -x /tmp/vllm-py ] || { echo "vllm-row: /tmp/vllm-py is missing: carry .whl/vllm/cN with the vbundle step first"; return 1; }
  pywheels || return 1
  running "$name" vllm-row && return 0
  echo "vllm-row: inferloom bench ${VLLM_SPEC:-examples/llama-3.1-8b-h200-vllm.yaml} --aa, 3 pairs (detached; follow $name)"
  detach "$name" env PYTHONPATH="$PWD/src:/tmp/site" INFERLOOM_GIT_REVISION="${INFERLOOM_GIT_REVISION:-unknown}" \
    python3 -m inferloom.cli bench "${VLLM_SPEC:-examples/llama-3.1-8b-h200-vllm.yaml}" --aa --min-pairs 3 --max-pairs 3 \
    --out "$dir/$name.json" --force
}

engines_job() {  # `inferloom engines` of two closed sessions of this machine (detached; `follow NAME`)
  local name=${1:?engines NAME A B} a=${2:?engines NAME A B} b=${3:?engines NAME A B}
  case $a in */*) ;; *) a=$SESSIONS/$a;; esac  # a name of this machine's sessions, or a carried session's path
  case $b in */*) ;; *) b=$SESSIONS/$b;; esac
  local dir=$SESSIONS/$name
  pywheels || return 1
  local s; for s in "$a" "$b"; do [ -f "$s/state.json" ] || { echo "engines: no session in $s (run and close it first)"; return 1; }; done
  running "$name" engines && return 0
  mkdir -p "$dir"
  echo "engines: inferloom engines $a $b --out $dir --trust-session --max-pairs ${ENGINE_PAIRS:-5} (detached; follow $name)"
  detach "$name" env PYTHONPATH="$PWD/src:/tmp/site" INFERLOOM_GIT_REVISION="${INFERLOOM_GIT_REVISION:-unknown}" \
    python3 -m inferloom.cli engines "$a" "$b" --out "$dir" --trust-session --max-pairs "${ENGINE_PAIRS:-5}"
}

[ $# -gt 0 ] || { awk 'NR > 1 && /^# A call carries/ {exit} NR > 1' "$0"; exit 2; }  # the header's steps
while [ $# -gt 0 ]; do
  case "$1" in
    bundle) { bundle && lean_fixups && fa3_addon; } || exit 1; shift;;
    check) check || exit 1; shift;;
    help) help_capture || exit 1; shift;;
    wheels) pywheels || exit 1; echo "wheels: /tmp/site has pydantic, optuna, sqlalchemy"; shift;;
    model) model || exit 1; shift;;
    start|session|plan) [ -n "${2:-}" ] || { echo "$1: give the session a NAME (e.g. $1 sg)"; exit 2; }
                   lean_pin
                   if [ "$1" = plan ]; then echo "plan: inferloom $(session_cmd "$SESSIONS/$2")"; else "$1" "$2" || exit 1; fi
                   shift 2;;
    follow) follow "${2:-}" || exit 1; shift 2;;
    profile) profile "${2:-}" || exit 1; shift 2;;
    vbundle) env -u VL -u SITE -u VPY bash "$HERE/gpu_vllm_session.sh" bundle || exit 1; shift;;
    vllm-row) vllm_row "${2:-}" || exit 1; shift 2;;
    vstart) env -u VL -u SITE -u VPY SPEC="${VLLM_SPEC:-examples/llama-3.1-8b-h200-vllm.yaml}" BUDGET_MIN="${VBUDGET_MIN:-3}" \
              MAX_TRIALS="${VMAX_TRIALS:-2}" OPTIMIZE_ARGS="${VOPTIMIZE_ARGS:---no-sweep}" bash "$HERE/gpu_vllm_session.sh" start "${2:?vstart NAME}" || exit 1; shift 2;;
    engines) engines_job "${2:-}" "${3:-}" "${4:-}" || exit 1; shift 4;;
    *) echo "unknown step '$1': expected bundle, check, help, wheels, model, start NAME, plan NAME, follow NAME, session NAME," \
            "profile NAME, vbundle, vllm-row NAME, vstart NAME or engines NAME A B"; exit 2;;
  esac
done
