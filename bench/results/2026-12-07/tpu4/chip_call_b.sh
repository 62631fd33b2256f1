#!/bin/bash
# Chip call B (2026-12-07, fifth session): tests/models' kernels part and the training part.
set -u
site=/tmp/lingvo_lite_site
if [ ! -e $site/.installed ]; then
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile \
      --no-cache-dir --upgrade --target $site .whl-tpu/*.whl && touch $site/.installed
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}:$site" PYTHONUNBUFFERED=1
clean() { grep -v "^[WI]0\|^E1207\|symbolize\|hugepages\|warnings.warn"; }
timeout 580 python3 bench/tpu_test_parts.py --out $OUT --part_seconds 330 kernels training 2>&1 | clean
