#!/bin/bash
# Chip call D (2026-12-07, fifth session): decode at main's cache by position (unpadded).
set -u
source bench/results/2026-12-07/tpu4/chip_env.sh  # run from the checkout's root
timeout 200 python3 bench/tpu_decode.py --shapes smollm2 --layouts scanned --attention auto \
  --batches 64,8,1 --json $OUT/decode.jsonl 2>&1 | clean > $OUT/decode.txt
cat $OUT/decode.txt
