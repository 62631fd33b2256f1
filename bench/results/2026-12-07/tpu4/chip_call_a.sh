#!/bin/bash
# Chip call A (2026-12-07, fifth session): decode with the padded cache by position, then the
# decode tests on the chip.
set -u
source bench/results/2026-12-07/tpu4/chip_env.sh  # run from the checkout's root
timeout 190 python3 bench/tpu_decode.py --shapes smollm2 --layouts scanned --attention auto \
  --batches 64,8,1 --json $OUT/decode.jsonl 2>&1 | clean > $OUT/decode.txt
timeout 120 python3 bench/tpu_decode.py --shapes head128 --layouts scanned --attention auto \
  --batches 64,8 --json $OUT/decode.jsonl 2>&1 | clean >> $OUT/decode.txt
cat $OUT/decode.txt
timeout 240 python3 bench/tpu_test_parts.py --out $OUT --part_seconds 180 decode 2>&1 | clean
