"""The default experiment, exactly as the README runs it, learns more than byte frequencies:
its final eval bits per byte is below the validation split's byte-unigram entropy."""

import collections
import json
import math
import os
import subprocess
import sys

import pytest

from tasks import pycode


def unigram_entropy_bits(root: str) -> float:
  """Entropy of the byte distribution over every validation file (plus one EOS per file)."""
  counts = collections.Counter()
  for relative in pycode.source_files(root, "validation"):
    with open(os.path.join(root, relative), "rb") as f:
      counts.update(f.read())
    counts["eos"] += 1
  total = sum(counts.values())
  return -sum(c / total * math.log2(c / total) for c in counts.values())


@pytest.mark.slow
def test_default_experiment_beats_the_unigram_entropy(tmp_path):
  completed = subprocess.run(
      [sys.executable, "-m", "lingvo_lite", "--exp=PyCodeTiny", f"--job_log_dir={tmp_path}",
       "--compilation_cache_dir="], capture_output=True, text=True, timeout=900, check=False)
  assert completed.returncode == 0, completed.stderr[-3000:]
  with open(tmp_path / "eval_metrics.jsonl") as f:
    final = [json.loads(line) for line in f][-1]
  entropy = unigram_entropy_bits(pycode.stdlib_dir())
  print(f"final eval: {final['bits_per_token']:.3f} bits/byte; unigram entropy "
        f"{entropy:.3f} bits/byte")
  assert final["step"] == 800
  assert 3.0 < entropy < 6.0  # Sanity of the reference: source code is not random bytes.
  assert final["bits_per_token"] < entropy
