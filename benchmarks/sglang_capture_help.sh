#!/bin/bash
# Capture the real `python -m sglang.launch_server --help` of SGLang 0.5.17 on the H200 (issue 32), for
# tests/data/sglang/ (today's file there was captured on a CPU machine: its README says how).
#
#   bash benchmarks/sglang_capture_help.sh prepare     # here (a developer's machine, PyPI reachable):
#       downloads the cp312 manylinux wheels the import needs (55 MiB on 2026-12-03) into .whl/sglang-help/
#       p1 (the sglang wheel, 22 MiB) and p2 (the rest, 33 MiB), ignored by git
#   bash benchmarks/sglang_capture_help.sh capture     # on the H200, two device calls back to back (the
#       machine keeps /tmp while warm): carry [".whl/sglang-help/p1"], then [".whl/sglang-help/p2"] (or
#       both in one call where the carry fits); each call installs what it carried with --no-index --no-deps
#       into /tmp/sgl-site on top of
#       the machine's own torch 2.11.0 / CUDA 13 Python 3.12, runs the help from / and writes
#       $OUT/sglang-0.5.17-help-h200.txt (+ .err, + versions.txt). A module still missing is named in
#       $OUT/missing.txt: add its wheel to WHEELS below and carry again.
#
# The H200 image (../shared/FACTS.md) has Python 3.12, torch 2.11.0+cu130, transformers 5.17.0, numpy,
# scipy; not pydantic, fastapi or SGLang. SGLang 0.5.17 pins transformers==5.12.1 (5.24 fails at import:
# "'qwen3_asr' is already used by a Transformers config"), so that wheel is carried too. The list is the
# import closure found on CPU (tests/data/sglang/README.md) less what the H200 already has.
set -uo pipefail
MODE=${1:-capture}
DIR=${DIR:-.whl/sglang-help}
SITE=${SITE:-/tmp/sgl-site}
OUT=${OUT:-runs/sglang-help}
WHEELS=(sglang==0.5.17 transformers==5.12.1 torchvision==0.26.0 orjson pybase64 fastapi starlette pydantic
        pydantic-core annotated-types typing-inspection anyio sniffio ipython ipython-pygments-lexers jedi parso
        pexpect ptyprocess prompt-toolkit wcwidth stack-data asttokens executing pure-eval traitlets
        matplotlib-inline decorator pygments msgspec pyzmq dill partial-json-parser xgrammar sentencepiece)

if [ "$MODE" = prepare ]; then
  mkdir -p "$DIR/p1" "$DIR/p2"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DIR/p2" "${WHEELS[@]}" || exit 1
  mv "$DIR"/p2/sglang-*.whl "$DIR/p1/"
  du -sh "$DIR"/p1 "$DIR"/p2
  echo "carry: [\"$DIR/p1\"] in one device call, [\"$DIR/p2\"] in the next, back to back"
  exit 0
fi

mkdir -p "$OUT" "$SITE"
whls=$(ls "$DIR"/p1/*.whl "$DIR"/p2/*.whl 2>/dev/null)
if [ -n "$whls" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" $whls \
    > "$OUT/install.log" 2>&1 || { echo "install failed: $(tail -3 "$OUT/install.log")"; exit 1; }
  echo "installed $(echo "$whls" | wc -l) wheel(s) into $SITE"
fi
PYTHONPATH=$SITE python3 -c "import importlib.metadata as m; m.version('sglang'); m.version('fastapi')" 2>/dev/null || {
  echo "not both parts in $SITE yet (sglang and its deps): carry the other part in the next call, back to back"
  exit 0; }
{ python3 --version; PYTHONPATH=$SITE python3 -c "import torch, transformers, importlib.metadata as m
print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no gpu')
print('transformers', transformers.__version__, 'sglang', m.version('sglang'))"; } > "$OUT/versions.txt" 2>&1
cat "$OUT/versions.txt"
(cd / && PYTHONPATH=$SITE timeout 300 python3 -m sglang.launch_server --help) \
  > "$OUT/sglang-0.5.17-help-h200.txt" 2> "$OUT/sglang-0.5.17-help-h200.err"
rc=$?
grep -o "No module named '[^']*'" "$OUT/sglang-0.5.17-help-h200.err" | tail -1 > "$OUT/missing.txt"
echo "help: exit $rc, $(wc -l < "$OUT/sglang-0.5.17-help-h200.txt") lines; missing: $(cat "$OUT/missing.txt")"
tail -3 "$OUT/sglang-0.5.17-help-h200.err"
exit $rc
