#!/bin/bash
# Chip call C (2026-12-07, fifth session): tests/models' families part.
set -u
source bench/results/2026-12-07/tpu4/chip_env.sh  # run from the checkout's root
timeout 580 python3 bench/tpu_test_parts.py --out $OUT --part_seconds 470 families 2>&1 | clean
