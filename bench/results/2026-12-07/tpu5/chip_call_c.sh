#!/bin/bash
# Chip call C (carries .whl-weights): the weights part (torch from the machine's /opt/wheels).
set -u
cd "$(dirname "$0")/../../../.."
source bench/results/2026-12-07/tpu4/chip_env.sh  # the fifth session preamble, unchanged
OUT=$OUT timeout ${WEIGHTS_SECONDS:-500} bash bench/tpu_check.sh weights 2>&1 | clean | tail -15
