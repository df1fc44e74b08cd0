#!/usr/bin/env bash
# Rebuilds the WeDLM checkpoint shipped in wedlm_hf/default_model from scratch, offline, with the project's own
# entry points; then measures it and renders its card (model_cards/wedlm-tiny-stdlib/README.md).
# Usage, from the repository root with the venv's bin on PATH: examples/train_default_model.sh [WORKDIR]
# Each training stage resumes from its last checkpoint, and is skipped once finished.
set -euo pipefail
out=${1:-build/default-model}
wedlm-hf train-tokenizer --data offline-mix --vocab-size 4096 --output "$out/tokenizer"
wedlm-hf train --config examples/default_model_config.json --tokenizer "$out/tokenizer" --data offline-mix \
  --seq-len 256 --batch-size 8 --max-steps 5000 --lr 1e-3 --warmup-ratio 0.05 --weight-decay 0.01 \
  --logging-steps 50 --save-steps 500 --seed 0 --items-per-family 20000 --output-dir "$out/run" --resume
wedlm-hf train --model "$out/run/final" --data offline-mix \
  --seq-len 256 --batch-size 8 --max-steps 5000 --lr 5e-4 --warmup-ratio 0.02 --weight-decay 0.01 \
  --logging-steps 50 --save-steps 500 --seed 1 --items-per-family 20000 --output-dir "$out/run2" --resume
wedlm-hf train --model "$out/run2/final" --data offline-mix \
  --seq-len 256 --batch-size 8 --max-steps 4000 --lr 3e-4 --warmup-ratio 0.02 --weight-decay 0.01 \
  --logging-steps 50 --save-steps 500 --seed 2 --items-per-family 20000 --output-dir "$out/run3" --resume
wedlm-hf ship-default "$out/run3/final"
wedlm-hf evaluate --items 100 --code-items 40 --output wedlm_hf/default_model/eval_results.json
wedlm-hf card wedlm_hf/default_model model_cards/wedlm-tiny-stdlib/README.md --repo-id wedlm-hf/wedlm-tiny-stdlib \
  --recipe examples/train_default_model.sh \
  --summary "A small WeDLM model trained from scratch, offline, on Python's standard library source and generated low-entropy tasks. It is the default model of wedlm-hf: small enough to ship inside the package, trained enough to show parallel decoding at work."
