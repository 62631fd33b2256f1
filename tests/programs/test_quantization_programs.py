"""model.quantization through the programs, as users run them, on the shared tiny job
(tests/trained_jobs.py: float32 checkpoints at steps 10 and 20) copied into the module's
working directory:

- a float run's checkpoint resumes in "int8" and the int8 run's evaluates in float (the
  quantization lives in the step; the state is float32 either way), config.txt recording it;
- decode and eval take "int8_weights"; the decode compile counts the int8 weights' bytes;
- the train compile for a TPU target counts int8 dots in the optimized HLO and gives the int8
  step time beside the bf16 one; for a CPU target it says there is no int8 peak;
- bad settings are one line, exit 2, and leave the job dir as it was.
"""

import json
import os

import pytest

from lingvo_lite.testing import run_cli
from tests import trained_jobs
from tests.trained_jobs import tree_digest

JOB = trained_jobs.TINY_JOB
TRAIN = list(trained_jobs.TINY_TRAIN)
INT8 = '--fdl.model.quantization="int8"'
INT8_WEIGHTS = '--fdl.model.quantization="int8_weights"'


@pytest.fixture(autouse=True)
def _in_workdir(tiny_job, monkeypatch):
  monkeypatch.chdir(tiny_job)


def _report(job: str) -> dict:
  with open(os.path.join(job, "compile", "report.json")) as f:
    return json.load(f)


def test_bad_quantization_settings_are_one_line_and_touch_nothing(tiny_job):
  before = tree_digest(JOB)
  cases = [
      ([*TRAIN, '--fdl.model.quantization="int4"'],
       "model.quantization must be one of 'int8', 'int8_weights' or None"),
      ([*TRAIN, INT8_WEIGHTS, "--fdl.train.steps=22"],
       "model.quantization='int8_weights': quantizes weights for decoding and serving"),
      ([*TRAIN, INT8_WEIGHTS, "--mode=compile", "--compile_topology=cpu:1"],
       "model.quantization='int8_weights': quantizes weights for decoding and serving"),
  ]
  for args, message in cases:
    result = run_cli(args)
    assert result.code == 2, (args, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], (args, result.stderr)
  assert tree_digest(JOB) == before
  assert not os.path.exists("runs/never")
  result = run_cli([*TRAIN[:-1], "--job_log_dir=runs/never", INT8_WEIGHTS])
  assert result.code == 2 and not os.path.exists("runs/never"), result.stderr


def test_float_checkpoint_resumes_in_int8_and_back(tiny_job):
  result = run_cli([*TRAIN, INT8, "--fdl.train.steps=22"])
  assert result.code == 0, result.stderr[-3000:]
  assert "resumed from step 20" in result.stdout + result.stderr
  assert "done: step 22" in result.stdout
  config_text = open(os.path.join(JOB, "config.txt")).read()
  assert "quantization" in config_text and "'int8'" in config_text
  rows = [json.loads(line) for line in open(os.path.join(JOB, "metrics.jsonl"))]
  assert rows[-1]["step"] == 22 and rows[-1]["loss"] < 5.0  # Trains on, from the float state.
  # The int8 run's checkpoint is float32 and evaluates in float.
  result = run_cli(["--mode=eval", f"--job_log_dir={JOB}", "--fdl.model.quantization=None"])
  assert result.code == 0, result.stderr[-3000:]
  assert "checkpoint step 22" in result.stdout


def test_decode_and_eval_take_int8_weights(tiny_job):
  result = run_cli(["--mode=decode", f"--job_log_dir={JOB}", "--prompt=def main(",
                    "--fdl.decode.max_new_tokens=8", INT8_WEIGHTS])
  assert result.code == 0, result.stderr[-3000:]
  assert "decoded 1 prompt(s)" in result.stdout
  result = run_cli(["--mode=eval", f"--job_log_dir={JOB}", INT8_WEIGHTS])
  assert result.code == 0, result.stderr[-3000:]


def test_decode_compile_counts_the_int8_weights(tiny_job):
  parameters = {}
  for label, setting in (("float", "--fdl.model.quantization=None"), ("int8", INT8_WEIGHTS)):
    result = run_cli([*TRAIN, "--mode=compile", "--compile_program=decode",
                      "--compile_topology=cpu:1", setting])
    assert result.code == 0, result.stderr[-3000:]
    report = _report(JOB)
    assert report["verdict"] == "FITS"
    parameters[label] = report["analytic"]["by_part"]["parameters"]
  # The tiny model's biases and norms stay float32: a little under 4x.
  assert parameters["float"] / parameters["int8"] > 3.0, parameters


def test_int8_train_compile_counts_int8_dots_and_the_int8_step_time(tiny_job):
  result = run_cli([*TRAIN, "--mode=compile", "--compile_topology=v5e-4", INT8])
  assert result.code == 0, result.stderr[-3000:]
  report = _report(JOB)
  # PyCodeTiny's GPT-J blocks: q, k, v, output, MLP in and out, forward and both gradients
  # (fewer instructions than that where XLA fuses some; never none).
  assert report["dots"]["int8"] > 0 and report["dots"]["float"] > 0, report["dots"]
  int8, bf16 = report["step_time"]["int8"], report["step_time"]
  assert int8["peak_ops_per_device"] == 394e12  # v5e's int8 peak: twice its bf16 197.
  assert bf16["seconds_at_50_mfu"] / 2 < int8["seconds_at_50_mfu"] < bf16["seconds_at_50_mfu"]
  text = open(os.path.join(JOB, "compile", "report.txt")).read()
  assert "int8 step time at 50% of the peaks" in text and "int8," in text
  result = run_cli([*TRAIN, "--mode=compile", "--compile_topology=cpu:1", INT8])
  assert result.code == 0, result.stderr[-3000:]
  assert _report(JOB)["step_time"]["int8"]["seconds_at_50_mfu"] is None
  assert "no int8 peak known for" in open(os.path.join(JOB, "compile", "report.txt")).read()
