#!/usr/bin/env bash
# Build what benchmarks/fleet_two_gpu.sh carries to the H200 machines (Python 3.12, no registry there):
#   DEST/ray-lean.tar.xz   Ray's cp312 manylinux wheel, unpacked, without ray/jars (the Java workers' jar,
#                          31 MiB compressed) and ray/dashboard/client/build (the dashboard's web UI): a fleet
#                          runs Python tasks with include_dashboard=False, so neither is ever read. The wheel
#                          itself is 76 MiB, over the 64 MiB a device call carries with the repository; this
#                          is ~30 MiB, so the whole run fits one call.
#   DEST/SHA256            its checksum (fleet_two_gpu.sh checks it before unpacking)
#   DEST/deps/*.whl        cp312 wheels of what the device's image lacks: Ray's jsonschema (+ referencing,
#                          rpds-py, jsonschema-specifications) and inferloom's pydantic / optuna / sqlalchemy
#                          (the versions of the project's .venv). Ray's other needs (click, filelock, msgpack,
#                          packaging, protobuf, pyyaml, requests, aiohttp) are in the image (KINDS.md's list).
# Usage (repository root, here; ~4 min on 2 cores, mostly xz):
#   bash benchmarks/ray_lean_bundle.sh [DEST]        # DEST default .whl/ray (git-ignored; carried as ".whl/ray")
set -euo pipefail
DEST=${1:-.whl/ray}
PY=${PY:-python3}   # a Python with pip (and the project's ray, whose version the bundle matches)
RAY_VERSION=${RAY_VERSION:-$("$PY" -c 'import ray; print(ray.__version__)' 2>/dev/null || echo 2.60.0)}
PLAT=(--only-binary=:all: --no-deps --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
mkdir -p "$DEST/deps"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
"$PY" -m pip download -q "${PLAT[@]}" -d "$TMP/w" "ray==$RAY_VERSION"
mkdir -p "$TMP/site" && (cd "$TMP/site" && unzip -q "$TMP"/w/ray-*.whl)
rm -rf "$TMP/site/ray/jars" "$TMP/site/ray/dashboard/client/build"
echo "ray $RAY_VERSION: ray/jars and ray/dashboard/client/build removed by benchmarks/ray_lean_bundle.sh" \
  > "$TMP/site/ray-$RAY_VERSION.dist-info/LEAN"
tar -C "$TMP/site" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - . \
  | xz -6 -T0 > "$DEST/ray-lean.tar.xz"
(cd "$DEST" && sha256sum ray-lean.tar.xz > SHA256 && echo "$RAY_VERSION" > RAY_VERSION)
"$PY" -m pip download -q "${PLAT[@]}" -d "$DEST/deps" \
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 \
  optuna==5.0.0 SQLAlchemy==2.1.9 alembic==1.20.1 colorlog==6.12.0 Mako==1.4.3 greenlet==3.5.6 \
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
du -sh "$DEST" "$DEST"/ray-lean.tar.xz "$DEST"/deps
