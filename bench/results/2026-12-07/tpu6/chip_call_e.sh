#!/bin/bash
# Chip call E (the machine of call D, warm): call D's four left-out wheels added to its sites
# (transformers' Gemma 3 module imports tokenizers through its docstrings; test_hf_folders
# imports sentencepiece), then call D's measurements again.
set -u
cd "$(dirname "$0")/../../../.."
for w in .whl-missing/*.whl; do
  case "$w" in *zstandard*) into=/tmp/lingvo_lite_site ;; *) into=/tmp/lingvo_lite_weights_site ;; esac
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile \
      --no-cache-dir --target "$into" "$w" 2>&1 | grep -v "already exists\|WARNING: Target" | tail -2
done
mkdir -p .whl-tpu-lite .whl-weights-lite  # call D's script moves these; its sites are in place
sed -n '/^source/,$p' bench/results/2026-12-07/tpu6/chip_call_d.sh > /tmp/call_d_rest.sh
bash /tmp/call_d_rest.sh
