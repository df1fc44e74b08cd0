#!/usr/bin/env bash
# Downloads into .whl/ the wheels scripts/gpu_check.sh installs on a GPU machine without network (Python 3.12,
# x86_64, torch already there): transformers and its Hub / tokenizer packages at the versions of
# scripts/constraints.txt with the pure-Python packages they need, and accelerate. torch and numpy are left out (the
# GPU machine has its own), and so is wedlm-hf: it is pure Python and the checkout that travels with .whl/ is the
# package (a wheel would carry the shipped model a second time). .whl/ is git-ignored; carry it along.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
pin() { grep -E "^$1==" scripts/constraints.txt; }
rm -rf .whl
mkdir -p .whl
download() {
  "$PY" -m pip download -q --disable-pip-version-check --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$@"
}
# With their dependencies (none of these needs torch): the whole pure-Python closure for Python 3.12.
download "$(pin transformers)" "$(pin huggingface_hub)" "$(pin tokenizers)" "$(pin safetensors)" psutil
# accelerate needs torch, which must come from the GPU machine: no dependencies (they are in the closure above).
download --no-deps "$(pin accelerate)"
rm -f .whl/numpy-*.whl
ls .whl
du -sh .whl
