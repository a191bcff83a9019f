#!/usr/bin/env bash
# Build, here, a lean SGLang 0.5.17 bundle for the H200 device (Python 3.12, torch 2.11.0+cu130 there), as
# tar.xz + SHA256 split into parts that fit a device call beside the repository (issue 32 item 5; the model:
# ../shared/gpu/vllm-lean-bundle.sh).
#
#   bash benchmarks/sglang_lean_bundle.sh [DEST] [--fa3]       # DEST default .whl/sglang (git-ignored)
#   bash benchmarks/sglang_lean_bundle.sh DEST --site DIR       # pack DIR as the site (no download: tests)
#
# DEST/cN/ (N = 0, 1, ...) each hold one part lean-sglang.tar.xz.part-NN; the last also SHA256. With --fa3,
# DEST/fa3/cN/ hold the optional FA3 add-on (sgl_kernel/flash_ops.abi3.so alone: SGLang's default attention
# backend on Hopper) the same way (fa3-sglang.tar.xz.part-NN, SHA256 in the last). The device side is
# benchmarks/gpu_sglang_session.sh's `bundle` step (one part folder per call, back to back; it checks, unpacks
# into /tmp/sglang-site and writes /tmp/sglang-py).
#
# What goes in: the wheels of benchmarks/sglang-0.5.17-lean-deps.txt (the server's import closure less what
# the image has; the file says how it was found; tokenizers 0.22.2 for transformers 5.12.1's import-time version
# check), installed for cp312 by pip's platform flags.
# What is dropped (`du` of each, 2026-12-04, below in DROPS):
#   sgl_kernel/flash_ops.abi3.so   1,071 MiB: FlashAttention 3/4 (the fa3/fa4 attention backends; SGLang picks fa3
#                                  by default on Hopper for Llama). Without it the server must be told
#                                  --attention-backend triton (gpu_sglang_session.sh pins attention_backend=triton).
#                                  --fa3 builds it as an add-on carried separately, its sm80/sm86 cubins (513 of
#                                  its 1,071 MiB) zeroed by benchmarks/fatbin_keep_arch.py (FA3_KEEP=90).
#   sgl_kernel/sm100/              Blackwell's common_ops (the H200 is sm90: load_utils picks sgl_kernel/sm90/).
#   sgl_kernel/flashmla_ops.abi3.so  FlashMLA (MLA models: DeepSeek), imported under try.
#   sgl_kernel/infllm_ops*.so      InfLLM-v2 attention (MiniCPM), loaded lazily by infllm_v2/_loader.py.
#   xgrammar/lib/libxgrammar.a     the static library (for C++ builds; Python loads libxgrammar_bindings.so).
#   flashinfer/data/{cutlass,cccl,csrc,include,spdlog}  flashinfer's JIT sources and headers (the image has nvcc,
#                                  not these; gpu_sglang_session.sh's lean_fixups points sgl_kernel's norms at its own kernels), so the flashinfer attention
#                                  backend is out too; greedy sampling (inferloom's requests are temperature 0)
#                                  takes SGLang's argmax path, not flashinfer's JIT sampling kernels.
#   bin/, */__pycache__            console scripts, byte code.
# Measured here on 2026-12-04 (2 shared cores; this script in about 5 min): 74 wheels, 495 MiB downloaded (sglang-kernel
# 0.4.5: 365 MiB), 1,647 MiB installed, 389 MiB after the drops; lean-sglang.tar.xz 68.7 MiB = 2 parts (c0 40.0 MiB,
# c1 28.7 MiB + SHA256); the FA3 add-on (sm90 cubins only) 1,071 MiB unpacked, fa3-sglang.tar.xz 122.2 MiB = 4 parts
# (40, 40, 40, 2.2 MiB; its xz took 20 min here). Versions: sglang 0.5.17, sglang-kernel 0.4.5, transformers 5.12.1,
# flashinfer-python 0.6.15.post1, apache-tvm-ffi 0.1.11, xgrammar 0.2.1, torchvision 0.26.0, openai 2.6.1, fastapi
# 0.136.3 (the rest: DEST/wheels.txt). Not yet run on the H200 (docs/sglang.md: what was checked here).
set -euo pipefail
DEST=.whl/sglang FA3=0 FROM=
while [ $# -gt 0 ]; do case "$1" in
  --fa3) FA3=1; shift;;
  --site) [ -d "${2:-}" ] || { echo "sglang_lean_bundle: --site needs a directory (got '${2:-}')"; exit 2; }; FROM=$2; shift 2;;
  -*) echo "sglang_lean_bundle: unknown option $1 (expected --fa3 or --site DIR)"; exit 2;;
  *) DEST=$1; shift;; esac; done
HERE=$(cd "$(dirname "$0")" && pwd)
PART=${PART:-40M}  # a device call carries <= 64 MiB with the repository (19.2 MiB tracked on 2026-12-04) and .whl/py (8.7)
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
if [ -n "$FROM" ]; then cp -r "$FROM" "$W/site"; (cd "$W/site" && ls) > "$W/wheels.txt"; else
echo "sglang_lean_bundle: downloading the wheels of $HERE/sglang-0.5.17-lean-deps.txt"
grep -v '^\s*#' "$HERE/sglang-0.5.17-lean-deps.txt" | grep -v '^\s*$' > "$W/deps.txt"
python3 -m pip download -q --no-deps $PLAT -d "$W/whl" -r "$W/deps.txt" 2>&1 | grep -v "is ignored" || true
[ "$(ls "$W"/whl/*.whl | wc -l)" -eq "$(wc -l < "$W/deps.txt")" ] || {
  echo "sglang_lean_bundle: $(ls "$W"/whl/*.whl | wc -l) wheels for $(wc -l < "$W/deps.txt") requirements: pip download failed"; exit 1; }
echo "sglang_lean_bundle: installing $(ls "$W"/whl/*.whl | wc -l) wheels for cp312 into a staging site"
python3 -m pip install -q --no-index --no-deps --no-compile $PLAT --abi cp312 --abi abi3 --abi none --target "$W/site" "$W"/whl/*.whl
(cd "$W/whl" && ls *.whl) > "$W/wheels.txt"; fi
S=$W/site
DROPS=(sgl_kernel/flash_ops.abi3.so sgl_kernel/sm100 sgl_kernel/flashmla_ops.abi3.so xgrammar/lib/libxgrammar.a
       flashinfer/data/cutlass flashinfer/data/cccl flashinfer/data/csrc flashinfer/data/include flashinfer/data/spdlog bin)
for d in "${DROPS[@]}" sgl_kernel/infllm_ops*.so; do
  for p in $S/$d; do [ -e "$p" ] && echo "  drop ${p#$S/} $(du -sm "$p" | cut -f1) MiB"; done; done | tee "$W/dropped.txt"
if [ "$FA3" = 1 ]; then  # the add-on: FA3's library with only the H200's (sm90) cubins left loadable
  mkdir -p "$W/fa3/sgl_kernel" && cp "$S/sgl_kernel/flash_ops.abi3.so" "$W/fa3/sgl_kernel/"
  python3 "$HERE/fatbin_keep_arch.py" "$W/fa3/sgl_kernel/flash_ops.abi3.so" --keep "${FA3_KEEP:-90}"; fi
for d in "${DROPS[@]}"; do rm -rf "${S:?}/$d"; done; rm -f "$S"/sgl_kernel/infllm_ops*.so
find "$S" -name __pycache__ -type d -prune -exec rm -rf {} +
cp "$W/wheels.txt" "$S/BUNDLE-wheels.txt"; cp "$W/dropped.txt" "$S/BUNDLE-dropped.txt"  # what the bundle holds
echo "sglang_lean_bundle: $(du -sm "$S" | cut -f1) MiB unpacked; compressing (xz -6, ~10 min on 2 cores)"

pack() {  # pack NAME SRC OUTDIR: NAME.tar.xz of SRC, SHA256, parts NAME.tar.xz.part-NN into OUTDIR/cN
  local name=$1 src=$2 out=$3
  tar -C "$src" -cf - . | xz -6 -T"${XZ_THREADS:-2}" > "$W/$name.tar.xz"
  (cd "$W" && sha256sum "$name.tar.xz" > "$name.SHA256")
  rm -rf "$out" && mkdir -p "$out"
  (cd "$W" && split -b "$PART" -d -a 2 "$name.tar.xz" "$name.tar.xz.part-")
  local i=0 p; for p in "$W/$name".tar.xz.part-*; do mkdir -p "$out/c$i"; mv "$p" "$out/c$i/"; i=$((i+1)); done
  mv "$W/$name.SHA256" "$out/c$((i-1))/SHA256"
  echo "sglang_lean_bundle: $name.tar.xz $(du -m "$W/$name.tar.xz" | cut -f1) MiB in $i part(s) of <= $PART: $out/c0..c$((i-1))"
  rm -f "$W/$name.tar.xz"
}
mkdir -p "$DEST"
pack lean-sglang "$S" "$DEST/lean"
if [ "$FA3" = 1 ]; then pack fa3-sglang "$W/fa3" "$DEST/fa3"; else rm -rf "$DEST/fa3"; fi
# the lean parts directly under DEST/cN (what the session script's default looks for)
rm -rf "$DEST"/c[0-9]*; for c in "$DEST"/lean/c*; do mv "$c" "$DEST/"; done; rmdir "$DEST/lean"
cp "$W/wheels.txt" "$DEST/wheels.txt"; cp "$W/dropped.txt" "$DEST/dropped.txt"
du -sm "$DEST"/c* "$DEST"/fa3/c* 2>/dev/null || true
