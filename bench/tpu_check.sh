#!/bin/bash
# Every TPU figure of the README's "Measured on a TPU v5e" table, on a TPU VM that has JAX
# (jax, jaxlib, libtpu) but not the project's other dependencies and no network. Those travel
# as wheels of requirements.lock's versions in .whl-tpu (git-ignored), made here once:
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.11 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
#       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       --platform manylinux1_x86_64 --platform any -d .whl-tpu -r bench/tpu_wheels.txt
#
# then, on the TPU VM, from the repository root:
#
#   bash bench/tpu_check.sh [STAGE ...]     STAGE: numerics train llama1b decode tests weights
#                                           moe profile int8 estimate fit (default: numerics train
#                                           decode)
#
# numerics: bench/tpu_numerics.py: splash against einsum on the chip, a 50-step tiny training
#         run and greedy decode of the tiny families, written for --compare with a CPU run.
# train:  bench/accelerator_mfu.py on Llama1BOneChip (552M parameters, sequence 2048): the
#         baseline rows (written-out attention, full remat) and this project's kernel, remat
#         policies and bfloat16 Adam moments, side by side in one process, each with the
#         compile report's step-time estimate of the same executable beside its measured
#         step; then a SmolLM2-135M fine-tune step.
# llama1b: Llama1B as registered on one chip (bfloat16 moments, offloaded or not).
# decode: bench/tpu_decode.py: SmolLM2-135M's shape at batch 1, 8 and 64, unrolled and
#         scanned layers; a shape with heads of 128 written out and with the decode kernel; each
#         with the model's cache layout and by head; against the copy bandwidth measured in
#         the same run.
# moe:    bench/moe_bench.py mfu: a small mixture-of-experts train step's MFU (active FLOPs),
#         dropless and capacity, beside a dense model of the same active size: $OUT/moe_mfu.json.
# profile: bench/tpu_profile.py: traces of batch-64 decode (both shapes) and the best
#         Llama1BOneChip row, summed by op: $OUT/<name>.json and <name>.xplane.pb.
# int8:   Llama1BOneChip's minimal row in bfloat16 and with model.quantization='int8'.
# estimate: bench/estimate_calibration.py: the compile report's step-time estimate beside the
#         measured step for every train row (the same executable), a traced step per row with
#         each kernel's measured time beside its estimate ($OUT/estimate_profile/<row>.json),
#         and the chip constants lingvo_lite/chips.py takes, measured: $OUT/estimate.jsonl.
# fit:    whether the compile verdict's rule is the chip's: a Llama1BOneChip row whose XLA:TPU
#         heap-simulated peak is 12.95 GiB but whose arguments + outputs - aliased +
#         temporaries are 16.05 GiB, past the chip's 15.75 (both from `--mode=compile
#         --compile_topology=v5e-1` on a CPU host): it ran on 2026-12-07 (56.3% MFU), so the
#         verdict decides by the peak; the train stage has the same row since.
# tests:  the suite's model, decode and training tests on the chip, in parts
#         (bench/tpu_test_parts.py): a JUnit file each, one summary line across them.
# weights: the weights tests (against transformers, peft and gguf): torch 2.13.0+cpu from the
#         TPU machine's own /opt/wheels, the rest as wheels of the lock's versions in
#         .whl-weights (28 MB: a call of its own, as a call carries at most 64 MiB), made once
#         by the recipe above with `-d .whl-weights -r bench/tpu_weights_wheels.txt`.
# Output: stdout, and $OUT/*.txt / *.jsonl when $OUT is set.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$(mktemp -d)}"
site="${TPU_CHECK_SITE:-/tmp/lingvo_lite_site}"
# Wheels into a site folder once (no index, no network): install_once SITE PIP_ARGS...
install_once() {
  local into="$1"
  shift
  [ -e "$into/.installed" ] && return 0
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps \
      --no-compile --no-cache-dir --upgrade --target "$into" "$@" || exit 1
  touch "$into/.installed"
}
[ -d .whl-tpu ] && install_once "$site" .whl-tpu/*.whl
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}:$site"
export PYTHONUNBUFFERED=1
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(numerics train decode)

# SmolLM2-135M's shape (experiments/lm/smollm2.py reads it from its GGUF file, which is not
# carried: the step's time does not depend on the weights), as its fine-tune runs: 8 x 512.
smollm2=(--set model.vocab_size=49152 --set model.num_layers=30 --set model.dim=576
         --set model.num_heads=9 --set model.num_kv_heads=3 --set model.head_dim=64
         --set model.mlp_dim=1536 --set model.rotary_base=100000.0 --set model.tie_embeddings=True
         --set train_data.vocab_size=49152 --set eval_data.vocab_size=49152
         --set train_data.sequence_length=512 --set train_data.global_batch_size=8
         --set train.grad_accum_steps=1 --set partitioner.ici_fsdp=1)

for stage in "${stages[@]}"; do
  case "$stage" in
    numerics)
      python3 bench/tpu_numerics.py --out "$out/numerics.json" 2>&1 | grep -v "^[WI]0" \
          | tail -3 | tee "$out/numerics.txt"
      ;;
    train)
      python3 bench/accelerator_mfu.py --experiment Llama1BOneChip --steps 10 \
          --json "$out/train.jsonl" \
          --variant "einsum_full_b4:model.attention_implementation='einsum';model.remat_policy='full'" \
          --variant "splash_full_b4:model.remat_policy='full'" \
          --variant "splash_save_attention_b4:model.remat_policy='save_attention'" \
          --variant "splash_minimal_b4:model.remat_policy='minimal'" \
          --variant "splash_minimal_b4_unrolled:model.remat_policy='minimal';model.scan_layers=False" \
          --variant "splash_none_b2:model.remat_policy='none';train_data.global_batch_size=2" \
          --variant "splash_minimal_b4_bf16_moments:model.remat_policy='minimal';optimizer.moment_dtype='bfloat16'" \
          --variant "splash_minimal_with_context_b4_bf16_moments:model.remat_policy='minimal_with_context';optimizer.moment_dtype='bfloat16'" \
          --variant "splash_minimal_with_context_b5_bf16_moments:model.remat_policy='minimal_with_context';optimizer.moment_dtype='bfloat16';train_data.global_batch_size=5" \
          2>&1 | grep -v "^[WI]0" | tee "$out/train.txt"
      python3 bench/accelerator_mfu.py --experiment Llama1B --steps 10 "${smollm2[@]}" \
          --json "$out/train.jsonl" \
          --variant "smollm2_135m_none_b8:model.remat_policy='none';model.scan_layers=False" \
          2>&1 | grep -v "^[WI]0" | tee -a "$out/train.txt"
      ;;
    llama1b)
      # Llama1B as registered (1.24B parameters, a 128k vocabulary) on one chip: the compile
      # table's rows that fit (bfloat16 Adam moments, offloaded to host memory or not).
      python3 bench/accelerator_mfu.py --experiment Llama1B --steps 5 --json "$out/llama1b.jsonl" \
          --set "train.grad_accum_steps=1" --set "partitioner.ici_fsdp=1" \
          --set "model.remat_policy='full'" \
          --variant "bf16_moments_b1:optimizer.moment_dtype='bfloat16';train_data.global_batch_size=1" \
          --variant "bf16_moments_offloaded_b3:optimizer.moment_dtype='bfloat16';optimizer.offload_state=True;train_data.global_batch_size=3" \
          2>&1 | grep -v "^[WI]0" | tee "$out/llama1b.txt"
      ;;
    fit)
      python3 bench/accelerator_mfu.py --experiment Llama1BOneChip --steps 5 --json "$out/fit.jsonl" \
          --variant "mwc_bf16m_b5:model.remat_policy='minimal_with_context';optimizer.moment_dtype='bfloat16';train_data.global_batch_size=5" \
          2>&1 | grep -v "^[WI]0" | tee "$out/fit.txt"
      ;;
    decode)
      # SmolLM2's heads of 64 have no kernel form (the written-out path either way): its
      # layouts; then heads of 128, the written-out path beside the decode kernel. Each with
      # the cache as the model keeps it ("auto": by position where the kernel does not read
      # it) beside the cache by head (models/kv_cache.py), in the same run.
      python3 bench/tpu_decode.py --shapes smollm2 --attention auto --cache_layouts auto,heads \
          --json "$out/decode.jsonl" 2>&1 | grep -v "^[WI]0" | tee "$out/decode.txt"
      python3 bench/tpu_decode.py --shapes head128 --layouts scanned --attention einsum,paged \
          --cache_layouts auto,heads --json "$out/decode.jsonl" 2>&1 | grep -v "^[WI]0" \
          | tee -a "$out/decode.txt"
      ;;
    tests)
      # The on-device tests in parts, each a pytest process with a JUnit file under $out and
      # a summary line (bench/tpu_test_parts.py says which parts and why a test is left out).
      python3 bench/tpu_test_parts.py --out "$out" 2>&1 | grep -v "^[WI]0" | tee "$out/tests.txt"
      ;;
    weights)
      wsite="${TPU_CHECK_WEIGHTS_SITE:-/tmp/lingvo_lite_weights_site}"
      install_once "$wsite" --find-links /opt/wheels torch==2.13.0+cpu .whl-weights/*.whl
      # Both weights parts, or those named in $WEIGHTS_PARTS (a device call of 10 minutes
      # takes one: "weights", "weights_more"), each for at most $PART_SECONDS.
      PYTHONPATH="$PYTHONPATH:$wsite" python3 bench/tpu_test_parts.py --out "$out" \
          --part_seconds "${PART_SECONDS:-480}" ${WEIGHTS_PARTS:-weights weights_more} 2>&1 | grep -v "^[WI]0" \
          | tee "$out/tests_weights_run.txt"
      ;;
    profile)
      # Where the device time goes (bench/tpu_profile.py): batch-64 decode of both decode
      # shapes, and the best Llama1BOneChip training row; each trace and op summary in $out.
      python3 bench/tpu_profile.py decode --shape smollm2 --batch 64 --name decode_smollm2_b64 \
          --out "$out" 2>&1 | grep -v "^[WI]0" | head -30 | tee "$out/profile.txt"
      python3 bench/tpu_profile.py decode --shape head128 --batch 64 --name decode_head128_b64 \
          --out "$out" 2>&1 | grep -v "^[WI]0" | head -30 | tee -a "$out/profile.txt"
      python3 bench/tpu_profile.py train --experiment Llama1BOneChip --name train_minimal_b4 \
          --set "model.remat_policy='minimal'" --out "$out" 2>&1 | grep -v "^[WI]0" \
          | head -45 | tee -a "$out/profile.txt"
      ;;
    int8)
      # int8 training (Qwix) against bfloat16 on the 552M shape, same batch and policy, one run.
      python3 bench/accelerator_mfu.py --experiment Llama1BOneChip --steps 10 \
          --json "$out/int8.jsonl" \
          --variant "bf16_minimal_b4:model.remat_policy='minimal'" \
          --variant "int8_minimal_b4:model.remat_policy='minimal';model.quantization='int8'" \
          2>&1 | grep -v "^[WI]0" | tee "$out/int8.txt"
      ;;
    estimate)
      python3 bench/estimate_calibration.py --profile "$out/estimate_profile" \
          --json "$out/estimate.jsonl" 2>&1 | grep -v "^[WI]0" | tee "$out/estimate.txt"
      ;;
    moe)
      python3 bench/moe_bench.py mfu --out "$out" 2>&1 | grep -v "^[WI]0" | tee "$out/moe.txt"
      ;;
    *) echo "tpu_check.sh: unknown stage $stage (numerics, train, llama1b, decode, tests, weights, moe, profile, int8, estimate, fit)" >&2
       exit 2 ;;
  esac
done
