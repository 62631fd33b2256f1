#!/bin/bash
# Session 2026-12-07 (fourth), call 1: splash tuning of the best Llama1BOneChip row, int8 in it,
# decode with the prefix span (smollm2 + head128).
set -u
site=/tmp/lingvo_lite_site
if [ ! -e $site/.installed ]; then PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .whl-tpu/*.whl && touch $site/.installed; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}:$site" PYTHONUNBUFFERED=1
o=$OUT; mkdir -p $o; date +%s > $o/t0
b="splash_mwc_bf16m_b4"
timeout 260 python3 bench/accelerator_mfu.py --experiment Llama1BOneChip --steps 10 --splash_block 1024 \
  --json $o/tune.jsonl --set "model.remat_policy='minimal_with_context'" --set "optimizer.moment_dtype='bfloat16'" \
  --variant "${b}_block1024:" \
  --variant "${b}_kvc512:splash.block_kv_compute=512" \
  --variant "${b}_unfused:splash.use_fused_bwd_kernel=False" \
  --variant "${b}_q2048:splash.block_q=2048" \
  --variant "${b}_qdkv2048:splash.block_q_dkv=2048" \
  --variant "${b}_kvdkv2048:splash.block_kv_dkv=2048;splash.block_kv_dkv_compute=1024" \
  --variant "${b}_kseqminor:splash.k_layout=SEQ_MINOR" \
  --variant "${b}_int8:model.quantization='int8'" \
  2>&1 | grep -v "^[WI]0" | grep -v "^E1207\|symbolize" > $o/tune.txt
date +%s >> $o/t0
timeout 130 python3 bench/tpu_decode.py --shapes smollm2 --layouts scanned --attention auto --batches 64,8,1 \
  --json $o/decode.jsonl 2>&1 | grep -v "^[WI]0" > $o/decode.txt
date +%s >> $o/t0
timeout 200 python3 bench/tpu_decode.py --shapes head128 --layouts scanned --attention einsum,auto --batches 64,8,1 \
  --json $o/decode.jsonl 2>&1 | grep -v "^[WI]0" >> $o/decode.txt
date +%s >> $o/t0
tail -n 12 $o/tune.txt; cat $o/decode.txt | grep -v "^E1\|symbolize"
