#!/usr/bin/env bash
# inferloom bench on one H200: llama-3.1-8b preset, bf16, concurrency 64,
# 256 in / 128 out. Runs on the device machine from the repository root:
#   carry .whl (pydantic and its deps as cp312 wheels; see docs/benchmarks.md)
# Writes JSON results and one log under $OUT (or runs/gpu).
set -uo pipefail
OUT=${OUT:-runs/gpu}; mkdir -p "$OUT"
if ! python3 -c "import pydantic" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
SPEC=examples/llama-3.1-8b-h200.yaml
IL="python3 -m inferloom.cli"
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  git rev-parse HEAD 2>/dev/null || true
} 2>&1 | tee "$OUT/gpu.log"
for job in "aa:--aa" "static:--candidate cache_implementation=static" \
           "static-ro:--candidate cache_implementation=static --candidate compile_mode=reduce-overhead"; do
  name=${job%%:*}; args=${job#*:}
  echo "=== $IL bench $SPEC $args --out $OUT/$name.json" | tee -a "$OUT/gpu.log"
  $IL bench $SPEC $args --out "$OUT/$name.json" 2>&1 | tee -a "$OUT/gpu.log"
done
