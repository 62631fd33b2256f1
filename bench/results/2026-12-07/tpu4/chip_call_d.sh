#!/bin/bash
# Chip call D (2026-12-07, fifth session): decode at main's cache by position (unpadded).
set -u
site=/tmp/lingvo_lite_site
if [ ! -e $site/.installed ]; then
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile \
      --no-cache-dir --upgrade --target $site .whl-tpu/*.whl && touch $site/.installed
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}:$site" PYTHONUNBUFFERED=1
clean() { grep -v "^[WI]0\|^E1207\|symbolize\|hugepages\|warnings.warn"; }
timeout 200 python3 bench/tpu_decode.py --shapes smollm2 --layouts scanned --attention auto \
  --batches 64,8,1 --json $OUT/decode.jsonl 2>&1 | clean > $OUT/decode.txt
cat $OUT/decode.txt
