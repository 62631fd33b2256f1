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
#   bash bench/tpu_check.sh [STAGE ...]     STAGE: train decode tests (default: train decode)
#
# train:  bench/accelerator_mfu.py on Llama1BOneChip (552M parameters, sequence 2048): the
#         issue's baseline rows and this project's best batch and remat policy, side by side in
#         one process, then the compile program's prediction for the same configs.
# decode: bench/tpu_decode.py: SmolLM2-135M's shape at batch 1, 8 and 64, unrolled and
#         scanned layers, against the copy bandwidth measured in the same run.
# tests:  the suite's model, decode and step tests on the chip, one pytest process, float32
#         comparisons at the highest matmul precision (tests/conftest.py sets it on TPUs).
# Output: stdout, and $OUT/*.txt / *.jsonl when $OUT is set.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$(mktemp -d)}"
site="${TPU_CHECK_SITE:-/tmp/lingvo_lite_site}"
if [ -d .whl-tpu ] && [ ! -e "$site/.installed" ]; then
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps \
      --no-compile --no-cache-dir --upgrade --target "$site" .whl-tpu/*.whl || exit 1
  touch "$site/.installed"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}:$site"
export PYTHONUNBUFFERED=1
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(train decode)

for stage in "${stages[@]}"; do
  case "$stage" in
    train)
      python3 bench/accelerator_mfu.py --experiment Llama1BOneChip --steps 10 \
          --json "$out/train.jsonl" \
          --variant "einsum_full_b4:model.attention_implementation='einsum';model.remat_policy='full'" \
          --variant "splash_full_b4:model.remat_policy='full'" \
          --variant "splash_minimal_b4:model.remat_policy='minimal'" \
          --variant "splash_save_attention_b4:model.remat_policy='save_attention'" \
          --variant "splash_none_b4:model.remat_policy='none'" \
          --variant "splash_none_b2:model.remat_policy='none';train_data.global_batch_size=2" \
          --variant "splash_minimal_b8:model.remat_policy='minimal';train_data.global_batch_size=8" \
          2>&1 | grep -v "^[WI]0" | tee "$out/train.txt"
      ;;
    decode)
      python3 bench/tpu_decode.py --json "$out/decode.jsonl" 2>&1 | grep -v "^[WI]0" \
          | tee "$out/decode.txt"
      ;;
    tests)
      python3 -m pytest -q -p no:cacheprovider tests/models tests/decode tests/test_steps.py \
          2>&1 | tail -40 | tee "$out/tests.txt"
      ;;
    *) echo "tpu_check.sh: unknown stage $stage (train, decode, tests)" >&2; exit 2 ;;
  esac
done
