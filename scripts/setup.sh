#!/usr/bin/env bash
# Creates .venv with everything wedlm-hf needs. Idempotent: a second run only checks.
# Without an NVIDIA GPU it installs the CPU build of torch (an unpinned torch would pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    pip install "torch==2.13.0"
  else
    pip install --index-url https://download.pytorch.org/whl/cpu --timeout 15 --retries 0 "torch==2.13.0" 2>/dev/null \
      || pip install "torch==2.13.0"
  fi
fi
pip install -c scripts/constraints.txt -e ".[test]"
