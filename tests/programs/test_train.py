"""The train program through the executor, in-process: exact resume, failure stops,
profiling, and the persistent compilation cache."""

import json
import os
import re
import time

import jax
import pytest
from etils import epath

from lingvo_lite import mfu
from lingvo_lite.runtime import run_info
from lingvo_lite.testing import run_cli

TINY_SYNTHETIC = ["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
                  "--fdl.train.log_every_steps=1", "--fdl.checkpoint.every_steps=3",
                  # A fixed decay horizon keeps the schedule the same whatever train.steps.
                  "--fdl.optimizer.decay_steps=20", "--fdl.optimizer.warmup_steps=2"]


def _losses(job_dir):
  with open(os.path.join(job_dir, "metrics.jsonl")) as f:
    return {row["step"]: row["loss"] for row in map(json.loads, f)}


def _train(job_dir, *extra, cache=None):
  """A tiny run; `cache`: its --compilation_cache_dir ('' for none; None: the default, in
  tests the suite's shared cache)."""
  cache_flag = [] if cache is None else [f"--compilation_cache_dir={cache}"]
  result = run_cli([*TINY_SYNTHETIC, f"--job_log_dir={job_dir}", *cache_flag, *extra])
  assert result.code == 0, result.stderr
  return result


def test_stopped_and_resumed_run_reproduces_the_uninterrupted_losses(tmp_path):
  whole, parts = tmp_path / "whole", tmp_path / "parts"
  log = _train(whole, "--fdl.train.steps=12").stdout
  _train(parts, "--fdl.train.steps=5")
  resumed = _train(parts, "--fdl.train.steps=12")
  assert "resumed from step 5" in resumed.stdout
  expected, got = _losses(whole), _losses(parts)
  assert sorted(got) == list(range(1, 13))
  assert got == expected  # Exactly equal, step by step.
  assert sorted(os.listdir(parts / "checkpoints")) == ["12", "9"]  # max_to_keep=2
  # Every logged step reports throughput and utilization, in the log and in metrics.jsonl.
  step_lines = [line for line in log.splitlines() if line.startswith("train step ")]
  assert len(step_lines) == 12
  assert all(re.search(r"TFLOP/step  [\d.e+-]+ TFLOP/s/device  MFU [\d.]+%  data wait \d+ ms",
                       line) for line in step_lines), step_lines[0]
  with open(whole / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  for key in ("model_tflop_per_step", "tflops_per_device", "mfu", "data_wait_s", "tokens_per_s"):
    assert all(row[key] >= 0 if key == "data_wait_s" else row[key] > 0 for row in rows), key


def test_a_non_finite_loss_stops_with_exit_code_1_and_saves_nothing(tmp_path):
  result = run_cli([*TINY_SYNTHETIC, f"--job_log_dir={tmp_path}",
                    "--fdl.optimizer.peak_learning_rate=1e35", "--fdl.optimizer.clip_grad_norm=None",
                    "--fdl.train.steps=12"])
  assert result.code == 1, result.stderr
  assert "loss is nan" in result.stderr or "loss is inf" in result.stderr
  assert len(result.stderr.strip().splitlines()) == 1
  assert not (tmp_path / "checkpoints").exists() or not os.listdir(tmp_path / "checkpoints")


def test_profiler_trace_of_a_step_window(tmp_path):
  _train(tmp_path, "--fdl.train.steps=4", "--fdl.train.profile_start_step=1",
         "--fdl.train.profile_steps=2")
  # Under the train run's TensorBoard folder, where `tensorboard --logdir=JOB/summaries` (the
  # command the run prints) shows it in the Profile tab.
  folder = tmp_path / "summaries" / "train" / "plugins" / "profile"
  traces = [os.path.join(root, name) for root, _, files in os.walk(folder) for name in files
            if name.endswith(".xplane.pb")]
  assert traces, list(os.walk(folder))
  # Each traced step is a StepTraceAnnotation ("train", step_num): the profile splits by step.
  data = b"".join(open(path, "rb").read() for path in traces)
  assert b"step_num" in data and b"train" in data


def test_rerun_hits_the_persistent_compilation_cache(tmp_path):
  cache = tmp_path / "cache"
  first = _train(tmp_path / "a", "--fdl.train.steps=2", cache=cache)
  entries = sorted(os.listdir(cache))
  assert entries, "the first run should fill the cache"
  second = _train(tmp_path / "b", "--fdl.train.steps=2", cache=cache)
  assert sorted(os.listdir(cache)) == entries  # Same programs: nothing new compiled.
  # The host's matmul peak too was measured by the first run only, and the second says so.
  assert f"({mfu.MEASURED})" in first.stdout and f"({mfu.KEPT})" in second.stdout


def test_compile_checkpoint_and_eval_time_stay_out_of_the_step_time(tmp_path, monkeypatch):
  """Saves and evaluations made to take 1.5 s each: counted as such in each row, not in the
  step time, tokens/s or MFU (with them, a 5-step window would be >= 0.3 s a step; a tiny
  step takes ~0.01 s quiet and stayed under 0.15 s at a load of 8 on 2 cores)."""
  from lingvo_lite.on_mesh import evaluation  # pylint: disable=g-import-not-at-top
  from lingvo_lite.checkpoints.manager import Checkpointer  # pylint: disable=g-import-not-at-top
  slow = 1.5

  def slowly(function):
    def wrapper(*args, **kwargs):
      time.sleep(slow)
      return function(*args, **kwargs)
    return wrapper
  monkeypatch.setattr(Checkpointer, "save", slowly(Checkpointer.save))
  monkeypatch.setattr(evaluation, "evaluate_sets", slowly(evaluation.evaluate_sets))
  log = _train(tmp_path, "--fdl.train.steps=10", "--fdl.train.log_every_steps=5",
               "--fdl.checkpoint.every_steps=5", "--fdl.train.eval_every_steps=5",
               cache="").stdout  # A compile, not a load from the cache: timed below.
  with open(tmp_path / "metrics.jsonl") as f:
    first, second = [json.loads(line) for line in f]
  for row in (first, second):
    assert row["step_time_s"] < slow / 10, row
    # tokens/s and TFLOP/s come from that step time (one device here).
    assert row["tokens_per_s"] == pytest.approx(256 / row["step_time_s"])
    assert row["tflops_per_device"] == pytest.approx(
        row["model_tflop_per_step"] / row["step_time_s"])
  # The compile (no cache) is timed before the first step and outweighs five tiny steps.
  assert first["compile_s"] > 5 * first["step_time_s"]
  assert first["checkpoint_s"] == first["eval_s"] == 0.0
  # The save and the evaluation after step 5 fall in the second window.
  assert second["checkpoint_s"] >= slow and second["eval_s"] >= slow
  assert second["compile_s"] == 0.0
  assert re.search(r"train step 10/10: .*\(not counted: checkpoint \d+\.\d\d s, eval "
                   r"\d+\.\d\d s\)$", log, re.M), log
  assert re.search(r"^compiled the train step in \d+\.\d s$", log, re.M), log
  # The run's identity, for the report: one row for this start.
  (identity,) = run_info.read(epath.Path(tmp_path))
  assert identity["experiment"] == "experiments.lm.pycode.PyCodeTiny"
  assert identity["start_step"] == 0 and identity["mesh"] == {"stage": 1, "data": 1, "fsdp": 1, "expert": 1, "tensor": 1}
  assert identity["device_count"] == 1 and identity["process_count"] == 1
  assert identity["versions"]["jax"] == jax.__version__
  assert "--fdl.train.eval_every_steps=5" in identity["argv"]
