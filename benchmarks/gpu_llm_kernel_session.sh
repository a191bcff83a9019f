#!/usr/bin/env bash
# Issue 15 on one H200: a real session whose KERNEL phase is the LLM kernel author's (agents.llm.roles:
# kernel_author), the author played by the tests' scripted localhost server through the real openai SDK
# (benchmarks/gpu_llm_kernel_session.py says what is scripted), on the llama-3.1-8b preset (random bf16
# weights), c64, 256 in / OUTPUT_LEN out, the stack pinned to cache_implementation=static (eager), FRAMEWORK
# ended at once. Then, while the call has time, the tests' own silu_mul and decode attention gated verbatim.
#   bash benchmarks/gpu_llm_kernel_session.sh            # on the GPU; everything under $OUT
#   TINY=1 bash benchmarks/gpu_llm_kernel_session.sh     # the CPU rehearsal (llama-tiny, TRITON_INTERPRET=1)
# The device has no pydantic / optuna / openai: WHL (default .whl) holds cp312 wheels of openai 3.57.0 and its
# closure (httpx2, httpcore2, truststore, h11, anyio, sniffio, idna, jiter, pydantic, pydantic_core,
# annotated-types, typing-inspection, typing-extensions) and optuna's (optuna, SQLAlchemy, alembic, colorlog,
# Mako, greenlet); the download command is benchmarks/gpu_session.sh's, with these names.
# Env: OUT, WHL, CALL_S (570: the call's seconds; the verbatim step runs only with >= 150 s left),
# SESSION_TIMEOUT (480), BUDGET_MIN (5.5), MAX_TRIALS (4), OUTPUT_LEN (64).
set -uo pipefail
T0=$(date +%s)
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(dirname "$HERE")
OUT=${OUT:-runs/gpu-llm-kernel}; mkdir -p "$OUT"
WHL=${WHL:-.whl}
PY=${PY:-python3}
if ! $PY -c "import pydantic, optuna, openai" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL"/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$ROOT/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export INFERLOOM_KB=/tmp/inferloom-llmk-kb.sqlite INFERLOOM_GIT_REVISION=${INFERLOOM_GIT_REVISION:-unknown}
DIR=/tmp/sessions/llmk; rm -rf "$DIR" /tmp/sessions/verbatim; mkdir -p /tmp/sessions
LOG=$OUT/session.log
if [ "${TINY:-0}" = 1 ]; then
  export TRITON_INTERPRET=1
  ARGS=(--spec "$ROOT/examples/llama-tiny.yaml" --set traffic.concurrency=4 --set traffic.input_len=32
        --set traffic.output_len=16 --set traffic.num_prompts=8 --set protocol.bootstrap_resamples=999
        --set kernels.min_speedup=0.001 --set quality.eval_prompts=4 --set quality.heldout_prompts=4)
else
  nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
  ARGS=(--spec "$ROOT/examples/llama-3.1-8b-h200.yaml" --set traffic.output_len="${OUTPUT_LEN:-64}")
fi
# common: few pairs, every writable category a target, the stack pinned (static cache, eager; sdpa attention)
ARGS+=(--set protocol.min_pairs=3 --set protocol.max_pairs=5 --set kernels.min_share=0.0 --pin cache_implementation=static)
timeout -s KILL "${SESSION_TIMEOUT:-480}" $PY "$HERE/gpu_llm_kernel_session.py" "${ARGS[@]}" --out "$DIR" \
  --summary "$OUT/summary.json" --decode-source "$HERE/llm_kernels/decode_attention_blocked.py" \
  --budget-minutes "${BUDGET_MIN:-5.5}" --max-trials "${MAX_TRIALS:-4}" 2>&1 | grep --line-buffered -v '^USDT' | tee "$LOG"
echo "session exit: ${PIPESTATUS[0]} after $(( $(date +%s) - T0 )) s" | tee -a "$LOG"
tar czf "$OUT/session.tgz" -C /tmp/sessions llmk
LEFT=$(( ${CALL_S:-570} - ($(date +%s) - T0) ))
if [ "$LEFT" -ge 150 ]; then
  timeout -s KILL $(( LEFT - 30 )) $PY "$HERE/gpu_llm_kernel_session.py" --verbatim "${ARGS[@]}" \
    --out /tmp/sessions/verbatim --summary "$OUT/verbatim.json" 2>&1 | tee "$OUT/verbatim.log"
  echo "verbatim exit: ${PIPESTATUS[0]} after $(( $(date +%s) - T0 )) s" | tee -a "$OUT/verbatim.log"
else
  echo "verbatim: skipped, only $LEFT s left" | tee "$OUT/verbatim.log"
fi
