#!/bin/bash
# Chip call B: the weights tests' first part (carrying .whl-weights; the project's other wheels
# were installed by call A on the same warm machine).
set -u
cd "$(dirname "$0")/../../../.."
source bench/results/2026-12-07/tpu4/chip_env.sh
OUT=$OUT WEIGHTS_PARTS=weights PART_SECONDS=400 timeout 490 bash bench/tpu_check.sh weights 2>&1 | clean | tail -12
