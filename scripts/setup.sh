#!/usr/bin/env bash
# Creates .venv with everything wedlm-hf needs. Idempotent: a second run only checks, and installs again only when
# pyproject.toml, scripts/constraints.txt or this script changed, or the packages are no longer importable.
# Without an NVIDIA GPU it installs the CPU build of torch (an unpinned torch would pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
STAMP=.venv/.wedlm-hf-setup  # what the last complete install was made from
wanted="$(cat pyproject.toml scripts/constraints.txt scripts/setup.sh | cksum) $(pwd)"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
# The playground's browser test drives Debian's chromium, the replicas example's test Debian's nginx; install them
# when missing and this user may.
missing=""
command -v chromium >/dev/null 2>&1 || missing="chromium"
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing="$missing nginx"
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian's$missing (the playground's browser test, the replicas example's test)"
    # shellcheck disable=SC2086  # one package name per word
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing) \
      >/dev/null || echo "setup: could not install$missing; the tests that need them will be skipped, saying why"
  else
    echo "setup:$missing not found (install them from Debian to run the browser and replicas tests)"
  fi
fi
installed() { .venv/bin/python -c "import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, sys.argv[1:])))" "$@" 2>/dev/null; }
if [ "$(cat "$STAMP" 2>/dev/null)" = "$wanted" ] && installed torch transformers wedlm_hf pytest; then
  echo "setup: .venv is up to date (nothing to install)"
  exit 0
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
if ! installed torch; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "setup: installing torch 2.13.0"
    pip install "torch==2.13.0"
  else
    echo "setup: installing torch 2.13.0 (CPU build)"
    pip install --index-url https://download.pytorch.org/whl/cpu --timeout 15 --retries 0 "torch==2.13.0" 2>/dev/null \
      || pip install "torch==2.13.0"
  fi
fi
echo "setup: installing wedlm-hf (editable) with the test extra, pinned by scripts/constraints.txt"
pip install -c scripts/constraints.txt -e ".[test]"
.venv/bin/python scripts/fetch_transformers_testers.py  # transformers' common testers, for the installed version
echo "$wanted" > "$STAMP"
