"""The README's main job, `bash bin/demo.sh`, run in a working copy of the repository: it sets
up (reusing the built venv), trains the default experiment (SentencePiece tokens of the stdlib;
the vocabulary and stores are made on first use) into the relative job directory
runs/pycode_sp_tiny, and learns more than byte frequencies: its final eval bits per byte (of
the evaluated text's UTF-8 bytes) is below the validation split's byte-unigram entropy.

The demo as written trains 800 steps (three minutes on 2 cores, the suite's longest target
when it ran here); this test passes the script one more flag, `--fdl.train.steps=60`, which
already shows the learning (2.65 bits per byte against the bytes' 4.70 when measured; 2.42 at
100 steps). The full run's result is the README's first command and its printed numbers, a
convergence run like bench/'s. tests/test_readme.py runs the README's other
commands with a few steps."""

import collections
import json
import math
import os
import re
import subprocess

import pytest

from lingvo_lite import testing
from tasks import pycode

# Steps of the demo's run here (the demo's own 800 are a convergence run, not a test).
STEPS = 60


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
def test_demo_as_written_beats_the_unigram_entropy(tmp_path):
  copy = testing.make_working_copy(tmp_path / "repo")
  env = dict(os.environ)
  # A user's shell: bin/demo.sh sets PYTHONPATH itself; the runner's forced devices are not
  # the demo's. A fresh JAX compilation cache (the demo's default is ~/.cache): the run must
  # not lean on what earlier runs compiled.
  for name in ("PYTHONPATH", "XLA_FLAGS"):
    env.pop(name, None)
  env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
  completed = subprocess.run(["bash", "bin/demo.sh", "runs/pycode_sp_tiny",
                              f"--fdl.train.steps={STEPS}"], cwd=copy, env=env,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=900, check=False)
  assert completed.returncode == 0, completed.stderr[-3000:]
  # bin/setup.sh found the venv this test runs in: it neither built one nor installed Bazel.
  assert "setup: building" not in completed.stderr, completed.stderr[-3000:]
  assert "setup: installing" not in completed.stderr, completed.stderr[-3000:]

  out = completed.stdout
  assert re.search(rf"^done: step {STEPS}$", out, re.MULTILINE), out[-3000:]
  train_loss = re.search(r"^  final train loss: (\d+\.\d+)$", out, re.MULTILINE)
  eval_loss = re.search(r"^  final eval loss: +(\d+\.\d+) \((\d+\.\d+) bits/token, "
                        r"(\d+\.\d+) bits/byte\)$", out, re.MULTILINE)
  assert train_loss and eval_loss, out[-3000:]
  # The default job directory is relative: it is under the working directory.
  with open(copy / "runs" / "pycode_sp_tiny" / "eval_validation.jsonl") as f:
    final = [json.loads(line) for line in f][-1]
  assert final["step"] == STEPS
  assert float(eval_loss.group(2)) == pytest.approx(final["bits_per_token"], abs=1e-4)
  assert float(eval_loss.group(3)) == pytest.approx(final["bits_per_byte"], abs=1e-4)
  # Bits per byte is the same nats over the text's bytes: more bytes than tokens.
  assert final["bytes"] > 2 * final["tokens"]
  assert final["bits_per_byte"] == pytest.approx(
      final["loss"] * final["tokens"] / math.log(2) / final["bytes"], rel=1e-6)

  # The demo ends with the job's report, which shows the loss training printed last.
  assert re.search(r"^report: runs/pycode_sp_tiny/report/index\.html$", out, re.M), out[-3000:]
  page = (copy / "runs" / "pycode_sp_tiny" / "report" / "index.html").read_text()
  assert re.search(rf'id="final-train-loss"[^>]*>{re.escape(train_loss.group(1))}<', page)

  entropy = unigram_entropy_bits(pycode.stdlib_dir())
  print(f"final train loss {train_loss.group(1)}; final eval: {final['bits_per_byte']:.3f} "
        f"bits/byte; unigram entropy {entropy:.3f} bits/byte")
  assert 3.0 < entropy < 6.0  # Sanity of the reference: source code is not random bytes.
  assert final["bits_per_byte"] < entropy
