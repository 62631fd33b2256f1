#!/bin/bash
set -u
site=/tmp/lingvo_lite_site
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}:$site" PYTHONUNBUFFERED=1
o=$OUT
timeout 150 python3 bench/accelerator_mfu.py --experiment Llama1BOneChip --steps 10 --splash_block 1024 \
  --json $o/tune.jsonl --set "model.remat_policy='minimal_with_context'" --set "optimizer.moment_dtype='bfloat16'" \
  --variant "splash_mwc_bf16m_b4_kseqminor:splash.k_layout=SEQ_MINOR" \
  --variant "splash_mwc_bf16m_b4_kseqminor_kvc512:splash.k_layout=SEQ_MINOR;splash.block_kv_compute=512" \
  --variant "splash_mwc_bf16m_b4_kvseqminor:splash.k_layout=SEQ_MINOR;splash.v_layout=SEQ_MINOR" \
  2>&1 | grep -v "^[WI]0" | grep -v "^E1207\|symbolize" > $o/tune.txt
timeout 150 python3 bench/tpu_decode.py --shapes head128 --layouts scanned --attention auto --batches 64,8,1 \
  --json $o/decode.jsonl 2>&1 | grep -v "^[WI]0" > $o/decode.txt
timeout 110 python3 bench/tpu_decode.py --shapes smollm2 --layouts scanned --attention auto --batches 8,1 \
  --json $o/decode.jsonl 2>&1 | grep -v "^[WI]0" >> $o/decode.txt
cat $o/tune.txt; grep -v "^E1\|symbolize\|hugepages\|warnings.warn" $o/decode.txt
