#!/bin/bash
# Chip call B: the tests' models part, then a trace of SmolLM2's batch-64 decode step.
set -u
cd "$(dirname "$0")/../../../.."
source bench/results/2026-12-07/tpu4/chip_env.sh  # the fifth session preamble, unchanged
timeout 470 python3 bench/tpu_test_parts.py --out $OUT --part_seconds 450 models 2>&1 | clean | tail -15
timeout 110 python3 bench/tpu_profile.py decode --shape smollm2 --batch 64 --name decode_smollm2_b64 \
    --out $OUT 2>&1 | clean | head -40 | tee $OUT/profile.txt
