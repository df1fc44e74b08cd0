#!/usr/bin/env bash
# Rebuilds the WeDLM checkpoint shipped in wedlm_hf/default_model from scratch, offline, with the project's own
# entry points (model card: model_cards/wedlm-tiny-stdlib/README.md). Usage: examples/train_default_model.sh [OUT]
set -euo pipefail
out=${1:-build/default-model}
wedlm-hf train-tokenizer --data offline-mix --vocab-size 4096 --output "$out/tokenizer"
wedlm-hf train --config examples/default_model_config.json --tokenizer "$out/tokenizer" --data offline-mix \
  --seq-len 256 --batch-size 8 --max-steps 4000 --lr 1e-3 --warmup-ratio 0.05 --weight-decay 0.01 \
  --logging-steps 50 --save-steps 500 --seed 0 --items-per-family 20000 --output-dir "$out/run" --resume
