#!/bin/bash
# Chip call A (2026-12-07, seventh session): every row of the README's TPU table in one process
# (the batch-5 row among them; the first run since the new embedding lookup and the
# all_to_all dispatch landed), then decode of both shapes at 64, 8 and 1 slots as main runs it.
set -u
cd "$(dirname "$0")/../../../.."
source bench/results/2026-12-07/tpu4/chip_env.sh
OUT=$OUT timeout 330 bash bench/tpu_check.sh train 2>&1 | clean | grep -v "^Traceback\|^  File" | tail -14
timeout 110 python3 bench/tpu_decode.py --shapes smollm2 --layouts scanned --attention auto \
    --batches 64,8,1 --json $OUT/decode.jsonl 2>&1 | clean | tee $OUT/decode.txt | tail -4
timeout 110 python3 bench/tpu_decode.py --shapes head128 --layouts scanned --attention einsum \
    --batches 64,8,1 --json $OUT/decode.jsonl 2>&1 | clean | tee -a $OUT/decode.txt | tail -4
