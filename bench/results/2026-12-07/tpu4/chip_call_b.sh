#!/bin/bash
# Chip call B (2026-12-07, fifth session): tests/models' kernels part and the training part.
set -u
source bench/results/2026-12-07/tpu4/chip_env.sh  # run from the checkout's root
timeout 580 python3 bench/tpu_test_parts.py --out $OUT --part_seconds 330 kernels training 2>&1 | clean
