"""The suite's on-device tests, run on a TPU in parts, each its own pytest process with a JUnit
file, and one summary line across the parts.

  python3 bench/tpu_test_parts.py --out DIR [PART ...]
      (bash bench/tpu_check.sh tests: every part but the weights parts, by default)

Parts (each meant to finish under 8 minutes on one v5e chip: a command may run 10; tests/models
whole ran past 8 minutes there on 2026-12-07, 122 of its 265 tests done, hence four parts; the
chip took about 5x the CPU host's time for the kernels part, 329 s):
  kernels   tests/models' attention kernels, layers and latent attention
  families  tests/models' families (the family API, dense families, Mistral, DeepSeek's MoE)
  adapters  tests/models' LoRA, mixture-of-experts and quantization tests
  models    tests/models' remat, transformer and layer-kind tests
  decode    tests/decode: cached decoding against teacher forcing, sampling, requests
  training  the step, DPO and optimizer tests (tests/test_steps.py, test_dpo.py,
            test_optimizers.py)
  weights   tests/weights' Hugging Face folders, dense families, DeepSeek and GGUF files,
            and contradicting weights, against transformers and gguf
  weights_more  tests/weights' MoE families, PEFT adapters and job weights, and tests/models'
            tests against transformers (DeepSeek's MoE, the dense families' parameter
            counts), which the families part skips without torch (both weights parts need
            torch, transformers, peft and gguf installed there)

Float32 comparisons run at the highest matmul precision (a TPU's default keeps three digits).
The chip takes one process at a time, so the parts run one after another. Each skip is listed
with its reason in DIR/tests_summary.txt, and so is each deselected test (`DESELECTED`: what
the TPU machine cannot run, with why). New on 2026-12-07 and not yet run on a chip as parts:
the 15 cases that failed there on 2026-12-06 pass on it (run singly). A test that starts
`python -m lingvo_lite` as a child while its own process holds the chip failed there on
2026-12-07 ("The TPU is already in use"): such children now run on the CPU
(CHILDREN_ON_CPU), not yet seen on the chip.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET

_MODELS = "tests/models/test_"
PARTS = {
    "kernels": [f"{_MODELS}{name}.py" for name in (
        "attention_kernels", "decode_attention", "flash_attention", "latent_attention",
        "gpt_oss", "layers", "layer_layout", "weight_matmul")],
    "families": [f"{_MODELS}{name}.py" for name in (
        "family", "dense_families", "mistral", "deepseek_moe")],
    "adapters": [f"{_MODELS}{name}.py" for name in ("lora", "moe", "quantization")],
    "models": [f"{_MODELS}{name}.py" for name in ("remat", "transformer", "layer_kinds")],
    "decode": ["tests/decode"],
    "training": ["tests/test_steps.py", "tests/test_dpo.py", "tests/test_optimizers.py"],
    # The tests against transformers, peft and gguf, with the models' tests that read
    # transformers (skipped in the parts above, where the TPU machine has no torch;
    # bench/tpu_check.sh weights installs it). Two parts: tests/weights whole ran past 8
    # minutes on the chip on 2026-12-07, 105 of its tests done.
    "weights": [f"tests/weights/test_{name}.py" for name in (
        "contradicting_weights", "gguf_checkpoint", "hf_deepseek", "hf_dense_families",
        "hf_folders")],
    "weights_more": [*(f"tests/weights/test_{name}.py" for name in (
        "hf_moe_families", "job_checkpoint", "peft")),
                     f"{_MODELS}deepseek_moe.py", f"{_MODELS}dense_families.py"],
}
# Tests that need what the TPU machine does not carry (seqio and TensorFlow), by node id.
DESELECTED = {
    "tests/decode/test_decode.py::test_text_through_a_sentencepiece_vocabulary_and_stop_strings":
        "a SentencePiece vocabulary needs seqio and TensorFlow, which the TPU machine lacks",
    "tests/weights/test_contradicting_weights.py::"
    "test_a_new_job_dir_is_recorded_only_once_the_weights_are_read[eval]":
        "the eval builds PyCodeTiny's token store, an Apache Beam pipeline the TPU machine lacks",
}
PART_SECONDS = 480
CHILDREN_ON_CPU = "LINGVO_LITE_TEST_CHILDREN_ON_CPU"  # tests/conftest.py reads it.
# What runs when no part is named: every part but the weights parts, which need torch and
# the other libraries installed first (bench/tpu_check.sh weights does that, then names them).
WEIGHTS_PARTS = ("weights", "weights_more")
DEFAULT_PARTS = [part for part in PARTS if part not in WEIGHTS_PARTS]


def _run(part: str, out: str, seconds: int) -> str:
  """Runs one part for at most `seconds`; returns its JUnit file's path."""
  junit = os.path.join(out, f"tests_{part}.xml")
  command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
             f"--junitxml={junit}", *PARTS[part],
             *(f"--deselect={node}" for node in DESELECTED)]
  # CHILDREN_ON_CPU: tests/conftest.py then starts the test's own children (`python -m
  # lingvo_lite` as a user types it) on the CPU: the chip takes one process at a time.
  env = dict(os.environ, JAX_DEFAULT_MATMUL_PRECISION="highest", **{CHILDREN_ON_CPU: "1"})
  with open(os.path.join(out, f"tests_{part}.txt"), "w", encoding="utf-8") as log:
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
      process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
      # An interrupt, not a kill: pytest then ends its session and still writes the JUnit
      # file of the tests it ran, so a part that runs long says which of them failed.
      process.send_signal(signal.SIGINT)
      try:
        process.wait(timeout=60)
      except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
      log.flush()
      log.write(f"\ntpu_test_parts: part {part} ran past {seconds} s and was stopped\n")
  return junit


def _counts(junit: str) -> tuple[int, int, int, list[str]]:
  """(passed, failed, skipped, the skips' 'node: reason' lines) of one JUnit file; a part
  that left none counts as one failure."""
  if not os.path.exists(junit):
    return 0, 1, 0, []
  suite = ET.parse(junit).getroot()
  suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
  failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
  skipped_cases = [case for case in suite.iter("testcase") if case.find("skipped") is not None]
  skips = [f"{case.get('classname')}::{case.get('name')}: "
           f"{case.find('skipped').get('message', '')}" for case in skipped_cases]
  total = int(suite.get("tests", 0))
  return total - failed - len(skips), failed, len(skips), skips


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("parts", nargs="*", default=DEFAULT_PARTS, choices=[*PARTS, []])
  parser.add_argument("--out", required=True)
  parser.add_argument("--part_seconds", type=int, default=PART_SECONDS,
                      help="each part's limit (a device call's own limit may be shorter)")
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  lines, totals = [], [0, 0, 0]
  for part in args.parts or DEFAULT_PARTS:
    passed, failed, skipped, skips = _counts(_run(part, args.out, args.part_seconds))
    totals = [totals[0] + passed, totals[1] + failed, totals[2] + skipped]
    lines.append(f"{part}: {passed} passed, {failed} failed, {skipped} skipped")
    lines += [f"  skipped {line}" for line in skips]
    print(lines[-1 - len(skips)], flush=True)
  lines += [f"deselected {node}: {why}" for node, why in DESELECTED.items()]
  lines.append(f"tests on the chip: {totals[0]} passed, {totals[1]} failed, "
               f"{totals[2]} skipped")
  with open(os.path.join(args.out, "tests_summary.txt"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  print(lines[-1], flush=True)


if __name__ == "__main__":
  main()
