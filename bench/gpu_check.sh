#!/bin/bash
# The accelerator checks of the scale-out issue, prepared to run in one call on a lent GPU
# machine (Python 3.12 with jax, flax, optax, orbax, etils and pyyaml; no fiddle, no network).
# fiddle imports libcst, a compiled package, so both travel as wheels:
#
#   here (once; .wheels is ignored by git):
#     pip download fiddle==0.3.1 --no-deps -d .wheels
#     pip download libcst==1.7.0 --no-deps --only-binary=:all: --python-version 3.12 \
#         --platform manylinux2014_x86_64 -d .wheels
#   there: bash bench/gpu_check.sh                                (carry .wheels)
#
# Prints, for the ~1B Llama experiment in bfloat16 on synthetic data, MFU against the
# datasheet peak and against a measured bf16 matmul peak, with cuDNN flash attention and
# with the written-out attention for comparison. Output also goes to $OUT when set.
set -euo pipefail
cd "$(dirname "$0")/.."
deps="$(mktemp -d)"
for wheel in .wheels/*.whl; do python3 -m zipfile -e "$wheel" "$deps"; done
export PYTHONPATH="$deps${PYTHONPATH:+:$PYTHONPATH}"
out="${OUT:-$(mktemp -d)}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$out/gpu.txt" || true
for attention in cudnn einsum; do  # One failing does not stop the other.
  python3 bench/accelerator_mfu.py --experiment Llama1B --steps 10 \
      --set "train_data.global_batch_size=8" --set "model.attention_implementation='$attention'" \
      2>&1 | grep -v "^W0\|^I0" | tee "$out/llama1b_$attention.txt" || true
done
