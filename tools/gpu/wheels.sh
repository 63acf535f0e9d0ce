#!/usr/bin/env bash
# Download, on a machine with PyPI, the wheels a lent GPU machine lacks (it has no network) into .whl/
# (git-ignored through .git/info/exclude; the device tool carries it with `carry: [".whl"]`).
# The GPU image runs CPython 3.12 with torch, Triton, numpy, einops, PyYAML, rich, safetensors, pluggy,
# ninja and onnx already there; these are what it misses (about 4 MB).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    pydantic==2.12.5 pydantic-core==2.41.5 annotated-types==0.7.0 typing-inspection==0.4.2 \
    typing-extensions==4.15.0 setuptools==80.9.0 xlstm==2.0.6 mlstm-kernels==2.0.6
ls -l .whl
