#!/bin/bash
# Chip call A (2026-12-07, sixth session): the fit question (does the Llama1BOneChip row the
# verdict's sum refuses run?), then the tests' adapters part.
set -u
cd "$(dirname "$0")/../../../.."
source bench/results/2026-12-07/tpu4/chip_env.sh  # the fifth session preamble, unchanged
OUT=$OUT timeout 150 bash bench/tpu_check.sh fit 2>&1 | clean | tail -25
timeout 420 python3 bench/tpu_test_parts.py --out $OUT --part_seconds 400 adapters 2>&1 | clean | tail -15
