#!/bin/bash
# Chip call C: the weights tests' second part, then where gemma3_scaled's logits part from the
# CPU's on the chip, module by module (bench/tpu_family_diff.py).
set -u
cd "$(dirname "$0")/../../../.."
source bench/results/2026-12-07/tpu4/chip_env.sh
OUT=$OUT WEIGHTS_PARTS=weights_more PART_SECONDS=300 timeout 370 bash bench/tpu_check.sh weights 2>&1 | clean | tail -12
PYTHONPATH="$PYTHONPATH:/tmp/lingvo_lite_weights_site" JAX_DEFAULT_MATMUL_PRECISION=highest \
    timeout 90 python3 bench/tpu_family_diff.py --cases gemma3_scaled,gemma3,qwen3_sliding \
    --json $OUT/family_diff.json 2>&1 | clean | grep -v "Writing model" | tee $OUT/family_diff.txt | head -90
