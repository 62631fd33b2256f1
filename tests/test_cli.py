"""End to end through `python -m lingvo_lite`: train on the real corpus, resume, reload the
written config, evaluate, list, print, and stop cleanly on SIGTERM."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from lingvo_lite.config import files as config_files, overrides, registry
from lingvo_lite.testing import override_directives
from tests.trained_jobs import tree_digest
from etils import epath

TINY = ["--exp=PyCodeTiny", "--fiddler=tiny"]


def _cli(*args, timeout=300):
  completed = subprocess.run([sys.executable, "-m", "lingvo_lite", *args],
                             capture_output=True, text=True, timeout=timeout, check=False)
  assert completed.returncode == 0, completed.stderr[-3000:]
  return completed.stdout


def _losses(job_dir):
  with open(os.path.join(job_dir, "metrics.jsonl")) as f:
    return {row["step"]: row for row in map(json.loads, f)}


@pytest.mark.slow
def test_train_resume_reload_and_eval(tmp_path):
  job = tmp_path / "job"
  out = _cli(*TINY, f"--job_log_dir={job}", "--fdl.train.steps=6",
             "--fdl.train.log_every_steps=2")
  assert "final eval loss" in out and f"checkpoints: {job}/checkpoints" in out
  for name in ("config.txt", "config.json", "metrics.jsonl", "eval_validation.jsonl"):
    assert (job / name).is_file(), name
  assert os.listdir(job / "checkpoints") == ["6"]
  assert any(f.startswith("events.out.tfevents")
             for f in os.listdir(job / "summaries" / "train"))
  rows = _losses(job)
  assert sorted(rows) == [2, 4, 6]
  assert {"step", "loss", "step_time_s", "tokens_per_s", "learning_rate",
          "grad_norm"} <= set(rows[6])

  # Rerunning with more steps resumes from the checkpoint.
  out = _cli(*TINY, f"--job_log_dir={job}", "--fdl.train.steps=8",
             "--fdl.train.log_every_steps=2")
  assert "resumed from step 6" in out
  assert sorted(_losses(job)) == [2, 4, 6, 8]

  # config.json rebuilds a config equal to the one the flags made.
  cfg = registry.lookup("PyCodeTiny").config()
  directives = override_directives(["--fiddler=tiny", "--fdl.train.steps=8",
                                    "--fdl.train.log_every_steps=2"])
  overrides.apply(cfg, directives, None)
  assert config_files.load(epath.Path(job) / "config.json") == cfg

  # Eval writes under JOB/eval/ and leaves the training files alone.
  training_files = {name: tree_digest(job / name) if (job / name).is_dir() else
                    (job / name).read_bytes() for name in os.listdir(job)}
  out = _cli(f"--job_log_dir={job}", "--mode=eval")
  assert "eval of checkpoint step 8" in out
  eval_rows = [json.loads(l) for l in
               (job / "eval" / "eval_validation.jsonl").read_text().splitlines()]
  assert eval_rows[0]["step"] == 8 and eval_rows[0]["loss"] > 0
  for name, before in training_files.items():
    after = tree_digest(job / name) if (job / name).is_dir() else (job / name).read_bytes()
    assert after == before, name


@pytest.mark.slow
def test_sigterm_saves_and_the_rerun_continues_the_same_curve(tmp_path):
  args = ["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
          "--fdl.train.steps=400", "--fdl.train.log_every_steps=1",
          "--fdl.checkpoint.every_steps=1000"]
  whole, parts = tmp_path / "whole", tmp_path / "parts"
  _cli(*args, f"--job_log_dir={whole}")

  process = subprocess.Popen([sys.executable, "-m", "lingvo_lite", *args,
                              f"--job_log_dir={parts}"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 120
  while time.time() < deadline:
    if (parts / "metrics.jsonl").exists() and len(_losses(parts)) >= 20:
      break
    time.sleep(0.05)
  process.send_signal(signal.SIGTERM)
  stdout, stderr = process.communicate(timeout=120)
  assert process.returncode == 0, stderr[-2000:]
  assert "SIGTERM: saved step" in stdout
  stopped_at = int(os.listdir(parts / "checkpoints")[0])
  assert 20 <= stopped_at < 400

  out = _cli(*args, f"--job_log_dir={parts}")
  assert f"resumed from step {stopped_at}" in out
  expected = {step: row["loss"] for step, row in _losses(whole).items()}
  got = {step: row["loss"] for step, row in _losses(parts).items()}
  assert got == expected


def test_list_and_print_need_no_job_dir():
  out = _cli("--mode=list")
  assert "lm.pycode.PyCodeTiny" in out and "lm.gptj.GptJ6B" in out
  out = _cli("--mode=print", "--exp=GptJ6B", "--fiddler=tiny", "--fdl.model.num_layers=3")
  assert "model.num_layers = 3" in out and "# command line: --fdl.model.num_layers=3" in out


def test_results_printed_to_stdout_are_never_lost_in_silence(tmp_path):
  """--mode=list/print's results are their stdout: a closed stdout is refused before they run
  (exit 1, a write of results that cannot succeed), and a reader that closed the pipe or a full
  disk is one line and exit 1 (not a traceback or a success) in any mode, --helpfull included."""
  closed = subprocess.run(f"{sys.executable} -m lingvo_lite --mode=list >&-", shell=True,
                          capture_output=False, stderr=subprocess.PIPE, text=True,
                          cwd=tmp_path, check=False)
  assert closed.returncode == 1, closed.stderr
  assert closed.stderr.splitlines() == [
      "lingvo_lite: error: --mode=list: stdout is closed, so the results would be lost; give "
      "it a stdout (or redirect it to a file: > FILE)"]
  # A reader that closed the pipe (EPIPE) under --mode=list; a full disk (`> /dev/full`,
  # ENOSPC) under --helpfull: each one line and exit 1, in the program and in the help alike.
  reader, writer = os.pipe()
  os.close(reader)  # The reader is gone before the first line: every write meets EPIPE.
  with open("/dev/full", "w", encoding="utf-8") as full:
    for args, stdout, problem in ((["--mode=list"], writer, "the reader closed the pipe (EPIPE)"),
                                  (["--helpfull"], full, "the disk is full (ENOSPC)")):
      completed = subprocess.run([sys.executable, "-m", "lingvo_lite", *args], stdout=stdout,
                                 stderr=subprocess.PIPE, text=True, cwd=tmp_path, check=False)
      assert completed.returncode == 1, (args, completed.stderr)
      lines = completed.stderr.splitlines()
      assert len(lines) == 1 and lines[0].startswith("lingvo_lite: error: cannot write "), lines
      assert problem in lines[0], lines
  os.close(writer)
  assert os.listdir(tmp_path) == []
