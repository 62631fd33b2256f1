#!/bin/bash
# Chip call A (2026-12-07, fifth session): decode with the padded cache by position, then the
# decode tests on the chip.
set -u
site=/tmp/lingvo_lite_site
if [ ! -e $site/.installed ]; then
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile \
      --no-cache-dir --upgrade --target $site .whl-tpu/*.whl && touch $site/.installed
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}:$site" PYTHONUNBUFFERED=1
o=$OUT
clean() { grep -v "^[WI]0\|^E1207\|symbolize\|hugepages\|warnings.warn"; }
timeout 190 python3 bench/tpu_decode.py --shapes smollm2 --layouts scanned --attention auto \
  --batches 64,8,1 --json $o/decode.jsonl 2>&1 | clean > $o/decode.txt
timeout 120 python3 bench/tpu_decode.py --shapes head128 --layouts scanned --attention auto \
  --batches 64,8 --json $o/decode.jsonl 2>&1 | clean >> $o/decode.txt
cat $o/decode.txt
timeout 240 python3 bench/tpu_test_parts.py --out $o --part_seconds 180 decode 2>&1 | clean
