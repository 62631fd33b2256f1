#!/bin/bash
# Chip call D (a fresh machine: the project's wheels and the weights wheels in one call, as
# .whl-tpu-lite and .whl-weights-lite: .whl-tpu without uvloop, the server's event loop, and
# .whl-weights without hf_xet, the hub's downloads, which no weights test uses; less zstandard,
# networkx, tokenizers and sentencepiece, which none of this call's tests imports: with the
# checkout, 62 of the 64 MiB a call carries), in the order of what the session's device time left (625 s) should buy
# first: where gemma3_scaled's logits part from the CPU's on the chip
# (bench/tpu_family_diff.py); call B's failures again after their fixes (conftest's children
# without the hugepages warning, compares_a_child, the Apache Beam skip); then the weights
# tests' second part for as long as is left.
set -u
cd "$(dirname "$0")/../../../.."
mv .whl-tpu-lite .whl-tpu && mv .whl-weights-lite .whl-weights
source bench/results/2026-12-07/tpu4/chip_env.sh
# The weights site first (what tpu_check.sh's weights stage installs; it then finds it there).
wsite=/tmp/lingvo_lite_weights_site
[ -e $wsite/.installed ] || { PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q \
    --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $wsite \
    --find-links /opt/wheels torch==2.13.0+cpu .whl-weights/*.whl && touch $wsite/.installed; }
PYTHONPATH="$PYTHONPATH:/tmp/lingvo_lite_weights_site" JAX_DEFAULT_MATMUL_PRECISION=highest \
    timeout 60 python3 bench/tpu_family_diff.py --cases gemma3_scaled,gemma3 \
    --json $OUT/family_diff.json 2>&1 | clean | grep -v "Writing model" > $OUT/family_diff.txt
grep "on TPU" $OUT/family_diff.txt
PYTHONPATH="$PYTHONPATH:/tmp/lingvo_lite_weights_site" JAX_DEFAULT_MATMUL_PRECISION=highest \
    LINGVO_LITE_TEST_CHILDREN_ON_CPU=1 timeout 90 python3 -m pytest -q -rs -p no:cacheprovider \
    --junitxml=$OUT/tests_weights_fixes.xml \
    "tests/weights/test_contradicting_weights.py::test_a_gguf_that_contradicts_itself_as_a_user_runs_it" \
    "tests/weights/test_hf_folders.py::test_a_warm_start_from_hf_then_kill_9_resumes_from_the_jobs_own_checkpoint" \
    "tests/weights/test_hf_folders.py::test_slim_weights_are_the_parameters_alone_and_read_back_onto_a_mesh" \
    2>&1 | clean | tee $OUT/tests_weights_fixes.txt | tail -8
OUT=$OUT WEIGHTS_PARTS=weights_more PART_SECONDS=150 timeout 200 bash bench/tpu_check.sh weights 2>&1 | clean | tail -8
