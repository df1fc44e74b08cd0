#!/usr/bin/env bash
# GPU readiness check, under 8 minutes on one large GPU (H200). Prints:
#   (a) flash-attention-2 vs sdpa token equality of generate(strategy="wedlm"), batch 1 and 4 (skipped, with a line
#       saying so, when the flash_attn package is absent);
#   (b) `wedlm-hf bench --device cuda --dtype bfloat16`;
#   (c) on a random Qwen3-8B-shaped model in bf16, one decoding forward of 2W rows (W=16) over one AR step;
#   (d) on the same model, batch 1 and 16: ms per decoding step and tokens/s of generate, AR and WeDLM (forced
#       acceptance: wedlm_entropy_threshold=1e9, no eos), each static+compiled (cache_implementation="static",
#       transformers' default compile: CUDA graphs) and eager (DynamicCache), the memory bound (weight bytes / measured
#       copy bandwidth), and the targets with PASS/FAIL. Rows not started by 6.5 minutes are skipped, with a line;
#   (e) only when asked (--parts e): `wedlm-hf bench-lossless --device cuda`, eager, then with compiled decoders;
#   (f) a sampled WeDLM step's synchronisations (torch's sync debug mode), default and lossless: target one; and
#       whether samplers processed as one batch give each row its own warpers' scores on the device;
#   (g) only when asked (--parts g): the 8B-shaped model at batch 64, AR and WeDLM static+compiled,
#       then a torch.profiler summary of five eager WeDLM decoding steps (wall, host outside torch's operators,
#       device busy, top operators).
# A part that fails prints `PART (x) FAILED: <error>` and the next part runs; a failed part (not a missed target)
# makes the exit status 1.
# On a machine without network: run scripts/gpu_wheels.sh where there is one, and bring the .whl/ folder along;
# this script installs from it only the wheels whose package is missing or older there (into /tmp/site).
# Usage: scripts/gpu_check.sh [--parts abcdefg] [--json-dir DIR]   on the GPU machine, from a checkout with .whl/
#        scripts/gpu_check.sh --cpu [--parts ...]   dry run on the CPU: tiny sizes, float32, dynamo's eager backend,
#                                                   no wheel install
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ "${1:-}" = "--cpu" ]; then
  exec "$PY" scripts/gpu_check.py "$@"
fi
if ! ls .whl/*.whl >/dev/null 2>&1; then
  echo "gpu_check: no wheels in .whl/: run scripts/gpu_wheels.sh on a machine with network and bring .whl/ along." >&2
  exit 2
fi
# Wheels whose distribution is missing here or older than the wheel.
wheels=$("$PY" - .whl/*.whl <<'PYEOF'
import re, sys
from importlib.metadata import PackageNotFoundError, version

def key(v):
    return tuple(int(x) for x in re.findall(r"\d+", v)[:4])

for path in sys.argv[1:]:
    name, wanted = path.rsplit("/", 1)[-1].split("-")[:2]
    try:
        have = version(name.replace("_", "-"))
    except PackageNotFoundError:
        have = None
    if have is None or key(have) < key(wanted):
        print(path)
        print(f"gpu_check: installing {name} {wanted} (found: {have or 'none'})", file=sys.stderr)
PYEOF
)
rm -rf /tmp/site
# shellcheck disable=SC2086  # one path per word
[ -z "$wheels" ] || "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels
# The checkout is the package (pure Python): it leads the path, then the wheels installed above.
export PYTHONPATH=$(pwd):/tmp/site${PYTHONPATH:+:$PYTHONPATH}
exec "$PY" scripts/gpu_check.py "$@"
