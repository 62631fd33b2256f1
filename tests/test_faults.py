"""Nothing lost under faults: kill -9 mid-save, a full disk, a non-finite loss, a kill between
a checkpoint's commit and its checksums, a failed resume, orphaned temporary folders and a
second Ctrl-C.

Each case runs its faulted run as `python -m lingvo_lite` in a child process from a temporary
working directory with a relative `--job_log_dir`, as a user would, on the tiny synthetic-data
setup; the uninterrupted references the faults are held to, and resumes whose class a real
process already covers, run the same command in this process (`_in_process`: no start-up of
its own). The cases
share the suite's compilation cache (content-addressed, so sharing is safe), and the optimizer's
`decay_steps` is fixed so that runs of different lengths compile the same train step: only
the first run of each model, batch and optimizer setting compiles.
(Concurrent trainers on one job dir: tests/runtime/test_job_lock.py.)
"""

import functools
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from etils import epath

from lingvo_lite.checkpoints import health
from lingvo_lite.checkpoints import integrity as checkpoint_integrity
from lingvo_lite.checkpoints.manager import CheckpointSettings, Checkpointer
from lingvo_lite.programs.train import failures
from lingvo_lite.runtime import compilation_cache, small_disk, summaries
from lingvo_lite.testing import Terminal, run_cli, source_root
from tests.trained_jobs import tree_digest

ROOT = str(source_root())
BASE = ["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
        "--fdl.train.log_every_steps=1", "--fdl.optimizer.decay_steps=1000"]
TMP_MARKER = "orbax-checkpoint-tmp"
# Steps of 256 x 64 tokens take longer than a whole save of the tiny state (~0.15 s), so a
# save that fails has failed by the end of the step after the one that started it.
SLOW_STEPS = ["--fdl.train_data.global_batch_size=256"]
# `python -c LIMITED N -m lingvo_lite ...`: past N bytes a write fails with EFBIG ("File too
# large") instead of SIGXFSZ killing the process (an ignored signal stays ignored across
# exec). A wrapper, not preexec_fn: forking this multithreaded (JAX) process is unsafe.
LIMITED = ("import os, resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
           "n = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); "
           "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  """The suite's shared compilation cache (tests/conftest.py), else one of the module's own.
  Shared: these runs' programs (the tiny step at each learning rate and clipping here) are
  then compiled once per machine, not once per run of this file (~4 s a program on 2 cores).
  A kill that lands in a cache write can leave a truncated entry; JAX then warns (the suite
  silences that warning in every process) and compiles, so no case depends on it."""
  return os.environ.get(compilation_cache.JAX_ENV) or str(tmp_path_factory.mktemp("jax_cache"))


def _env():
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)  # One CPU device, whatever the test runner forces.
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
  return env


def _argv(job, cache, args, file_size_limit=None):
  python = [sys.executable]
  if file_size_limit is not None:
    python += ["-c", LIMITED, str(file_size_limit)]
  return [*python, "-m", "lingvo_lite", *BASE, f"--job_log_dir={job}",
          f"--compilation_cache_dir={cache}", *args]


def _run(cwd, job, cache, *args, timeout=240, file_size_limit=None, disk=None):
  """Runs the CLI to the end from `cwd` (`job` relative to it; where `disk`, a SmallDisk, is
  mounted)."""
  argv = _argv(job, cache, args, file_size_limit)
  return subprocess.run(disk.command(argv) if disk else argv, cwd=cwd, env=_env(),
                        capture_output=True, text=True, timeout=timeout, check=False,
                        stdin=subprocess.DEVNULL)


def _start(cwd, job, cache, *args, log_name="run"):
  """Starts the CLI in the background, its output appended to files in `cwd` (a pipe nobody
  reads would block it once full)."""
  with open(cwd / f"{log_name}.stdout", "a") as out, open(cwd / f"{log_name}.stderr", "a") as err:
    return subprocess.Popen(_argv(job, cache, args), cwd=cwd, env=_env(), stdout=out,
                            stderr=err, stdin=subprocess.DEVNULL)


def _stop(process):
  if process is not None and process.poll() is None:
    process.kill()
    process.wait(timeout=30)


def _ok(result):
  assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
  return result


def _rows(job):
  path = job / "metrics.jsonl"
  if not path.exists():
    return []
  rows = []
  for number, line in enumerate(path.read_text().splitlines(), 1):
    try:
      rows.append(json.loads(line))
    except ValueError:
      pytest.fail(f"{path} line {number} is not a JSON row: {line[:80]!r}")
  return rows


def _logged_step(job):
  """The newest step of a complete row of metrics.jsonl, read while a run may be writing it
  (or was killed mid-row); 0 if none."""
  path = job / "metrics.jsonl"
  newest = 0
  if path.exists():
    for line in path.read_text().split("\n")[:-1]:
      try:
        newest = max(newest, int(json.loads(line)["step"]))
      except (ValueError, KeyError, TypeError):
        pass
  return newest


def _complete_steps(job):
  """Final-named step folders orbax committed (with their step metadata), oldest first."""
  directory = job / "checkpoints"
  if not directory.is_dir():
    return []
  return sorted(int(name) for name in os.listdir(directory) if name.isdigit()
                and (directory / name / "_CHECKPOINT_METADATA").exists())


def _temporary_folders(job):
  directory = job / "checkpoints"
  return sorted(name for name in os.listdir(directory) if TMP_MARKER in name)


def _restore(step_dir):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  return ocp.StandardCheckpointer().restore(epath.Path(step_dir).absolute() / "default")


def _leaves(tree):
  import jax  # pylint: disable=g-import-not-at-top
  return {jax.tree_util.keystr(path): np.asarray(leaf)
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def _error_lines(stderr):
  return [line for line in stderr.splitlines() if line.startswith("lingvo_lite: error:")]


def _assert_one_error_line(stderr):
  """The run's last word is one `lingvo_lite: error:` line, with no traceback anywhere."""
  assert "Traceback" not in stderr, stderr[-3000:]
  lines = _error_lines(stderr)
  assert len(lines) == 1, stderr[-3000:]
  assert stderr.strip().splitlines()[-1] == lines[0], stderr[-3000:]
  return lines[0]


def _wait_for(condition, process, timeout, what):
  deadline = time.time() + timeout
  while time.time() < deadline:
    value = condition()
    if value:
      return value
    if process.poll() is not None:
      pytest.fail(f"the run exited ({process.returncode}) while waiting for {what}")
    time.sleep(0.001)
  pytest.fail(f"timed out after {timeout} s waiting for {what}")


# A job trained to step 6 with checkpoints 2, 4 and 6, copied into the cases that resume one.
TRAINED_ARGS = ["--fdl.checkpoint.every_steps=2", "--fdl.checkpoint.max_to_keep=5"]


@pytest.fixture(scope="module")
def trained_job(tmp_path_factory, cache):
  cwd = tmp_path_factory.mktemp("trained")
  # In this process (a start-up less): the reference the cases' own processes are held to.
  _in_process_ok(cwd / "job", cache, *TRAINED_ARGS, "--fdl.train.steps=6")
  assert _complete_steps(cwd / "job") == [2, 4, 6]
  return cwd / "job"


def _copy_job(trained_job, destination):
  shutil.copytree(trained_job, destination, symlinks=True)
  return destination


# 1. Kill -9, again and again, also while a save is in flight.

# The soak's size: here 2 kills, one the moment a save is in flight and one at a random
# moment (each class of kill once); bench/kill_soak.sh runs the same soak with 6 kills over
# 140 steps (these variables), a sweep rather than a check.
SOAK_KILLS = int(os.environ.get("LINGVO_LITE_SOAK_KILLS", "2"))


@pytest.mark.slow
def test_kill_9_soak_loses_nothing(tmp_path, cache):
  # Each run below progresses ~10-20 steps before its kill: 20 steps a kill and 20 more fit.
  steps, every = 20 * SOAK_KILLS + 20, 10
  args = [f"--fdl.train.steps={steps}", f"--fdl.checkpoint.every_steps={every}"]
  # The uninterrupted run first: it also fills the compilation cache, so no kill lands in
  # a cache write (JAX's cache does not write atomically). It and the final resume run in this
  # process (a start-up less each); the killed runs are the real processes.
  began = time.time()
  _in_process_ok(tmp_path / "whole", cache, *args)
  print(f"uninterrupted run: {time.time() - began:.1f} s")
  parts = tmp_path / "parts"
  rng = np.random.default_rng(0)
  kills, kills_in_flight, wanted_kills, process = 0, 0, SOAK_KILLS, None
  try:
    for attempt in range(wanted_kills):
      start = max(_complete_steps(parts), default=0)
      process = _start(tmp_path, "parts", cache, *args, log_name="parts")
      # Progress first: one step of this run committed (so no run is wasted), then the kill.
      saved = _wait_for(lambda: [s for s in _complete_steps(parts) if s > start], process, 120,
                        f"a checkpoint after step {start} (kill {attempt})")[0]
      if attempt % 2 == 0:  # The moment the next save's temporary folder appears.
        _wait_for(lambda: [n for n in _temporary_folders(parts)
                           if int(n.split(".")[0]) > saved], process, 60,
                  f"a save in flight after step {saved}")
      else:  # After a random number of steps: mid-step, mid-save, between a commit and its
        target = saved + int(rng.integers(1, every + 1))  # checksums...
        _wait_for(lambda: _logged_step(parts) >= target, process, 60, f"step {target}")
      process.send_signal(signal.SIGKILL)
      process.wait(timeout=30)
      kills += 1
      # A kill in flight leaves the save's temporary folder behind.
      kills_in_flight += any(int(n.split(".")[0]) > saved for n in _temporary_folders(parts))
      print(f"kill {attempt} at {time.time() - began:.1f} s: resumed from <= {start}, saved "
            f"{saved}, logged {_logged_step(parts)}, in flight so far {kills_in_flight}")
    result = _in_process_ok(parts, cache, *args)
  finally:
    _stop(process)
  assert "resumed from step" in result.stdout
  # Every other kill waits for a save's temporary folder: most of those land in flight (the
  # rest just after the save's commit, which the random kills also cover): 1 of 2, 2 of 6.
  assert kills == wanted_kills and kills_in_flight >= max(1, wanted_kills // 3), (
      kills, kills_in_flight)

  # The same curve and the same final state as the uninterrupted run...
  whole = tmp_path / "whole"
  losses = {job.name: {row["step"]: row["loss"] for row in _rows(job)} for job in (whole, parts)}
  assert sorted(losses["whole"]) == list(range(1, steps + 1))
  assert losses["parts"] == losses["whole"]
  assert max(_complete_steps(parts)) == max(_complete_steps(whole)) == steps
  expected = _leaves(_restore(whole / "checkpoints" / str(steps)))
  got = _leaves(_restore(parts / "checkpoints" / str(steps)))
  assert sorted(got) == sorted(expected)
  different = [name for name in expected if not np.array_equal(got[name], expected[name])]
  assert not different, different[:5]
  # ... and the killed runs' rows past their checkpoints are gone: one row per step.
  logged = [row["step"] for row in _rows(parts)]
  assert logged == list(range(1, steps + 1)), (
      f"parts/metrics.jsonl: {len(logged)} rows for {steps} steps, "
      f"{len(logged) - len(set(logged))} of them repeats")
  assert _temporary_folders(parts) == []


# 2. A full disk (a real one: a small tmpfs), a file size limit: the run stops with one line,
# keeps every row of its verified checkpoints and no temporary file; a failed background save
# stops it at once. (bench/disk_full_sweep.py fills the disk at many more moments.)

def _assert_stopped_after_failed_save(result, job, failed_step, steps, cause):
  assert result.returncode == 1, (result.returncode, result.stderr[-3000:])
  line = _assert_one_error_line(result.stderr)
  assert re.search(rf"\bstep {failed_step}\b", line), line
  assert cause in line, line
  # The save of step S fails in the background while step S+1 runs (a step takes longer
  # than a save here): the failure is seen at the boundary after step S+1, and one more
  # step is allowed for a step already dispatched. So no step beyond S+2 runs, where the
  # unfixed run went on to the next save (S + every_steps) or the end. (Counted from the
  # progress lines: a run that fails before its first checkpoint takes its metric rows back.)
  ran = [int(n) for n in re.findall(rf"^train step (\d+)/{steps}:", result.stdout, re.M)]
  assert ran and failed_step <= max(ran) <= failed_step + 2 < steps, ran
  # No folder of the failed step claims success.
  assert failed_step not in _complete_steps(job)


# Throughput's figures, measured on the wall clock: the rest of a metrics row is a function of
# the step alone, whatever stopped and resumed the run.
WALL_CLOCK = set(summaries.Throughput(0, 1, 1, 1.0, 1, 1.0).report(1)) - {
    "model_tflop_per_step"}


def _curve(job):
  """metrics.jsonl's rows without their wall-clock figures."""
  return [{k: v for k, v in row.items() if k not in WALL_CLOCK} for row in _rows(job)]


def _tensorboard_losses(job):
  """(step, loss) of the train run's events, as TensorBoard's scalar reader loads them."""
  # pylint: disable-next=g-import-not-at-top
  from tensorboard.backend.event_processing import event_accumulator
  accumulator = event_accumulator.EventAccumulator(str(job / "summaries" / "train"),
                                                   {"scalars": 0})
  accumulator.Reload()
  return [(event.step, event.value) for event in accumulator.Scalars("loss")]


def _leftovers(job):
  """Temporary files and folders anywhere in the job: a rewrite's, the checksums', orbax's,
  a delete's, a step set aside."""
  return sorted(os.path.relpath(os.path.join(folder, name), job)
                for folder, folders, files in os.walk(job) for name in folders + files
                if ".tmp" in name or "-tmp" in name or "-deleting" in name
                or ".unverified" in name)


def test_a_full_disk_loses_no_verified_row_and_leaves_no_temporary_file(tmp_path, cache,
                                                                          trained_job):
  args = [*TRAINED_ARGS, "--fdl.train.steps=6"]  # trained_job's: the uninterrupted run.
  with small_disk.for_test(tmp_path / "disk", "4200k") as disk:
    job = disk.path / "job"
    # 1. Room for two checkpoints and not a third: steps 2 and 4 are verified (here on the
    # next save's path, with steps this fast), then saving step 6 fails.
    result = _run(tmp_path, "disk/job", cache, *args, disk=disk)
    assert result.returncode == 1, (result.returncode, result.stderr[-3000:])
    line = _assert_one_error_line(result.stderr)
    assert re.search(r"saving checkpoint step 6 failed: .*No space left on device.*; training "
                     r"stopped, and the newest checkpoint is step 4: free space", line), line
    assert _complete_steps(job) == [2, 4]
    for step in (2, 4):  # Intact and verified.
      step_dir = epath.Path(job / "checkpoints" / str(step))
      assert checkpoint_integrity.has_checksums(step_dir), step
      assert checkpoint_integrity.first_mismatch(step_dir) is None, step
    # The rows (and TensorBoard points) of the verified steps stay, the later ones go.
    assert _curve(job) == _curve(trained_job)[:4]
    assert _tensorboard_losses(job) == _tensorboard_losses(trained_job)[:4]
    assert _leftovers(job) == []

    # More room: the same command resumes from step 4, and ends as the uninterrupted run.
    disk.resize("64m")
    result = _ok(_run(tmp_path, "disk/job", cache, *args, disk=disk))
    assert "resumed from step 4" in result.stdout
    assert "done: step 6" in result.stdout

    # 2. The disk full but for 4 pages: rerunning the finished job rewrites config.json (11
    # pages) at its commit, which fails as one line and leaves the file as it was.
    config = (job / "config.json").read_bytes()
    disk.fill(free_pages=4)
    result = _run(tmp_path, "disk/job", cache, *args, disk=disk)
    disk.unfill()
    assert result.returncode == 1, (result.returncode, result.stderr[-3000:])
    line = _assert_one_error_line(result.stderr)
    assert re.search(r"writing \S+/disk/job/config\.json failed: No space left on device.*the "
                     r"newest checkpoint is step 6", line), line
    assert (job / "config.json").read_bytes() == config
    assert _leftovers(job) == []

    assert _curve(job) == _curve(trained_job)
    assert _tensorboard_losses(job) == _tensorboard_losses(trained_job)
    expected = _leaves(_restore(trained_job / "checkpoints" / "6"))
    got = _leaves(_restore(job / "checkpoints" / "6"))
    assert sorted(got) == sorted(expected)
    assert not [name for name in expected if not np.array_equal(got[name], expected[name])]


def test_file_size_limit_fails_the_first_save_cleanly(tmp_path):
  # 200 KB: more than the config, metrics and event files, less than the checkpoint's largest
  # data file (~1 MB), so the first save fails. No compilation cache: its entries are bigger
  # than the limit, and a truncated entry would outlive this run.
  result = _run(tmp_path, "job", "", "--fdl.train.steps=10", "--fdl.checkpoint.every_steps=3",
                *SLOW_STEPS, file_size_limit=200_000)
  job = tmp_path / "job"
  _assert_stopped_after_failed_save(result, job, 3, 10, "File too large")
  assert _complete_steps(job) == []


# 3. A non-finite loss: stop with the newest healthy checkpoint named (kept); its advice works.

def test_asyncio_reports_of_orbax_write_tasks_are_kept_off_stderr():
  # After a failed save, asyncio logs "Task exception was never retrieved" (with orbax's
  # traceback) for each write task whenever the garbage collector meets it: in some runs of
  # the test above, not others. The failure is already the run's one line.
  import logging  # pylint: disable=g-import-not-at-top
  from lingvo_lite.runtime import library_logs  # pylint: disable=g-import-not-at-top
  orbax_task = logging.LogRecord(
      "asyncio", logging.ERROR, "/usr/lib/python3.11/asyncio/base_events.py", 1771,
      "Task exception was never retrieved\nfuture: <Task finished coro=<write_fragment() done, "
      f"defined at {os.sep.join(['', 'venv', 'orbax', 'checkpoint', 'serialization.py'])}:188>>",
      None, None)
  other_task = logging.LogRecord("asyncio", logging.ERROR, "base_events.py", 1771,
                                 "Task exception was never retrieved: my_task", None, None)
  # A gathering future names no coroutine: orbax shows only in its traceback.
  orbax_code = compile("raise ValueError('OUT_OF_RANGE')",
                       os.sep.join(["", "venv", "orbax", "checkpoint", "serialization.py"]),
                       "exec")
  try:
    exec(orbax_code)  # pylint: disable=exec-used
  except ValueError:
    gathering = logging.LogRecord("asyncio", logging.ERROR, "base_events.py", 1771,
                                  "_GatheringFuture exception was never retrieved", None,
                                  sys.exc_info())
  # A future tensorstore failed has no Python frames at all: its exception quotes the
  # checkpoint's temporary folder (seen in CI, after the run's one error line).
  try:
    raise ValueError('OUT_OF_RANGE: Error writing "opt_state.1.0.mu.layer_1.attention.out_kernel'
                     '/0.0.0" in OCDBT database at local file "/tmp/job/checkpoints/3.orbax-'
                     'checkpoint-tmp/default.orbax-checkpoint-tmp/ocdbt.process_0/": File too '
                     'large [os_error_code=\'27\']')
  except ValueError:
    failed_write = logging.LogRecord("asyncio", logging.ERROR, "base_events.py", 1771,
                                     "Future exception was never retrieved\nfuture: <Future "
                                     "finished exception=ValueError('OUT_OF_RANGE')>", None,
                                     (ValueError, sys.exc_info()[1], None))
  for record in (orbax_task, gathering, failed_write):
    assert not library_logs.quiet_orbax(record)
  assert library_logs.quiet_orbax(other_task)


def test_a_diverged_run_names_the_newest_healthy_checkpoint_kept_across_a_resume(tmp_path,
                                                                                  cache):
  # Without clipping, a peak learning rate of 5 (reached over the 100 warmup steps) takes the
  # loss from 5.7 to 30 by step 12 (healthy until step 8: the rows after 2, 4 and 6 stay
  # within 2x the lowest); resumed at 100, the state goes non-finite by step ~25, with
  # finite but diverged checkpoints on the way (losses of 1e6 and more).
  common = ["--fdl.checkpoint.every_steps=2", "--fdl.checkpoint.max_to_keep=2",
            "--fdl.optimizer.clip_grad_norm=None"]
  job = tmp_path / "job"
  # The runs before and after the diverged one in this process (a start-up less each): the
  # diverged run is this class's real process.
  _in_process_ok(job, cache, *common, "--fdl.train.steps=12",
                 "--fdl.optimizer.peak_learning_rate=5")
  # max_to_keep=2 keeps 10 and 12, and also 6, the newest healthy step.
  assert _complete_steps(job) == [6, 10, 12]

  result = _run(tmp_path, "job", cache, *common, "--fdl.train.steps=60",
                "--fdl.optimizer.peak_learning_rate=1e2")
  assert result.returncode == 1, (result.returncode, result.stderr[-3000:])
  assert "resumed from step 12" in result.stdout
  line = _assert_one_error_line(result.stderr)
  saved = _complete_steps(job)
  for step in saved:
    leaves = _leaves(_restore(job / "checkpoints" / str(step)))
    not_finite = [name for name, leaf in leaves.items()
                  if np.issubdtype(leaf.dtype, np.floating) and not np.isfinite(leaf).all()]
    assert not not_finite, (step, not_finite[:5])
  # Step 6 is healthy by the rows of the first run (metrics.jsonl), the later ones are not:
  # 12 is judged against the lowest loss of the whole run, not of the resumed one.
  assert saved[0] == 6 and len(saved) == 3, saved
  diverged = [str(step) for step in saved[1:]]
  assert re.search(r" at step \d+; stopped without saving it; the newest healthy "
                   r"checkpoint is step 6 \(healthy: the first loss logged after it is finite "
                   r"and at most 2x the lowest logged loss, its gradient norm finite and at "
                   rf"most 100x the lowest\); steps {diverged[0]} and {diverged[1]} after it "
                   rf"had diverged already: move them out of \S+/job/checkpoints to resume "
                   r"from step 6, then rerun with a lower optimizer\.peak_learning_rate",
                   line), line

  # The advice works: moved away, a lower learning rate resumes from step 6 and trains on.
  for step in diverged:
    shutil.move(job / "checkpoints" / step, tmp_path / step)
  result = _in_process_ok(job, cache, *common, "--fdl.train.steps=12",
                          "--fdl.optimizer.peak_learning_rate=1e-3")
  assert "resumed from step 6" in result.stdout
  assert [row["step"] for row in _rows(job)] == list(range(1, 13))
  lowest = min(row["loss"] for row in _rows(job))
  assert all(row["loss"] < 2 * lowest for row in _rows(job) if row["step"] > 6), _rows(job)
  config_lines = [l for l in (job / "config.txt").read_text().splitlines()
                  if l.startswith("optimizer.peak_learning_rate ")]
  assert len(config_lines) == 1, config_lines
  assert re.match(r"optimizer\.peak_learning_rate = 0\.001 +# command line: "
                  r"--fdl\.optimizer\.peak_learning_rate=1e-3$", config_lines[0]), config_lines


# 4. A step whose checksums were never written is not restored silently.

def test_a_step_without_checksums_is_skipped_unless_asked_for(tmp_path, cache, trained_job):
  # As a kill between the commit of step 6 and its checksums leaves it.
  job = _copy_job(trained_job, tmp_path / "job")
  (job / "checkpoints" / "6" / checkpoint_integrity.CHECKSUMS_FILE).unlink()
  _copy_job(job, tmp_path / "job_unverified")

  result = _ok(_run(tmp_path, "job", cache, *TRAINED_ARGS, "--fdl.train.steps=8"))
  assert "resumed from step 4" in result.stdout
  about_6 = [l for l in result.stderr.splitlines() if re.search(r"\bstep 6\b", l)]
  assert len(about_6) == 1 and "checksum" in about_6[0], result.stderr[-3000:]
  assert "done: step 8" in result.stdout

  # The opt-in, in this process: the refusal above is the real process's.
  result = _in_process(tmp_path / "job_unverified", cache, *TRAINED_ARGS,
                       "--fdl.train.steps=8", "--fdl.checkpoint.restore_unverified=True")
  assert result.code == 0, result.stderr[-3000:]
  assert "resumed from step 6" in result.stdout
  assert "done: step 8" in result.stdout


# 6. max_to_keep=0 would keep nothing.

def test_max_to_keep_zero_is_refused(tmp_path):
  result = run_cli([*BASE, "--fdl.checkpoint.max_to_keep=0",
                    f"--job_log_dir={tmp_path / 'job'}"])
  assert result.code == 2, result
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("lingvo_lite: error: "), result.stderr
  assert "checkpoint.max_to_keep" in lines[0], lines[0]
  assert not (tmp_path / "job").exists()


# 7. A resume that fails after it started leaves the job as it was.

def test_a_failed_resume_leaves_the_job_dir_as_it_was(tmp_path, cache, trained_job):
  job = _copy_job(trained_job, tmp_path / "job")
  before = tree_digest(job)
  # A learning rate of 1e4 makes the loss non-finite within a few steps, long before the
  # next save. In this process: a resumed run's failure as a process (exit 1, one line) is
  # test_a_diverged_run_names_the_newest_healthy_checkpoint_kept_across_a_resume's.
  result = _in_process(job, cache, *TRAINED_ARGS, "--fdl.train.steps=40",
                       "--fdl.checkpoint.every_steps=1000",
                       "--fdl.optimizer.peak_learning_rate=1e4")
  assert result.code == 1, (result.code, result.stderr[-3000:])
  assert "resumed from step 6" in result.stdout
  assert "train step 7/40" in result.stdout  # It did start training.
  _assert_one_error_line(result.stderr)
  assert tree_digest(job) == before


# 8. Orphaned temporary folders; a second Ctrl-C.

def test_orphaned_temporary_folders_are_removed_on_the_next_start(tmp_path, cache, trained_job):
  job = _copy_job(trained_job, tmp_path / "job")
  # What a kill in the middle of saving step 9 leaves (a step this run will not save again).
  orphan = job / "checkpoints" / f"9.{TMP_MARKER}"
  shutil.copytree(job / "checkpoints" / "6" / "default", orphan / f"default.{TMP_MARKER}")
  # In this process: the folders real kills leave, a real process removes in
  # test_kill_9_soak_loses_nothing.
  result = _in_process(job, cache, *TRAINED_ARGS, "--fdl.train.steps=8")
  assert result.code == 0, result.stderr[-3000:]
  assert "resumed from step 6" in result.stdout
  named = [l for l in (result.stdout + result.stderr).splitlines() if orphan.name in l]
  if orphan.exists():
    assert len(named) == 1, f"{orphan.name} was neither removed nor reported once: {named}"
  else:
    assert len(named) <= 1, named


def test_a_second_ctrl_c_stops_at_once_with_exit_code_130(tmp_path, cache):
  process = None
  job = tmp_path / "job"
  try:
    process = _start(tmp_path, "job", cache, "--fdl.train.steps=100000",
                     "--fdl.checkpoint.every_steps=100000")
    _wait_for(lambda: _logged_step(job) >= 5, process, 120, "step 5")
    process.send_signal(signal.SIGINT)
    # The first Ctrl-C asks for a save; the second comes while that save is in flight.
    _wait_for(lambda: _temporary_folders(job), process, 60, "the stop's save to begin")
    process.send_signal(signal.SIGINT)
    sent = time.time()
    code = process.wait(timeout=30)
    waited = time.time() - sent
  finally:
    _stop(process)
  stderr = (tmp_path / "run.stderr").read_text()
  assert code == 130, (code, stderr[-3000:])
  assert waited < 5, waited
  assert "Traceback" not in stderr, stderr[-3000:]


# 9. A step folder holding another step's checkpoint (a copy, a rename) is refused as damaged.

def _eval_rows(job):
  """eval_validation.jsonl's rows without their wall-clock figures."""
  path = job / "eval_validation.jsonl"
  rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
  return [{k: v for k, v in row.items() if k not in ("seconds", "tokens_per_s")}
          for row in rows]


@functools.lru_cache
def _reference_leaves(step_dir):
  return _leaves(_restore(step_dir))


def _assert_ends_as(job, reference, step=6):
  """`job`'s checkpoint `step` holds bitwise the reference's arrays, and its rows are the
  reference's apart from wall-clock figures."""
  expected = _reference_leaves(str(reference / "checkpoints" / str(step)))
  got = _leaves(_restore(job / "checkpoints" / str(step)))
  assert sorted(got) == sorted(expected)
  assert not [name for name in expected if not np.array_equal(got[name], expected[name])]
  assert _curve(job) == _curve(reference)
  assert _eval_rows(job) == _eval_rows(reference)


def _in_process(job, cache, *args):
  """The same command as `_run`, in this process (no start-up of its own)."""
  return run_cli([*BASE, f"--job_log_dir={job}", f"--compilation_cache_dir={cache}", *args])


def _in_process_ok(job, cache, *args):
  """`_in_process`'s run, which must exit 0."""
  result = _in_process(job, cache, *args)
  assert result.code == 0, (result.code, result.stderr[-3000:])
  return result


def _as_before_step_records(step_dir):
  """Rewrites a step's checksums as code before they recorded their step wrote them."""
  record = step_dir / checkpoint_integrity.CHECKSUMS_FILE
  record.write_text(json.dumps(json.loads(record.read_text())["files"]))


def _copies_of_step_2(job: pathlib.Path) -> pathlib.Path:
  """A user's copies of step 2 over steps 6 and 4 of `job`: as 6 (its checksums say step 2),
  and as 4 with checksums as code before this check wrote them (no step: only its state's step
  counter tells). Returns the checkpoints folder."""
  checkpoints = job / "checkpoints"
  for step in ("6", "4"):
    shutil.rmtree(checkpoints / step)
    shutil.copytree(checkpoints / "2", checkpoints / step)
  _as_before_step_records(checkpoints / "4")
  return checkpoints


def test_a_step_folder_holding_another_step_is_refused_and_the_advice_skips_damaged_ones(
    tmp_path, cache, trained_job):
  job = _copy_job(trained_job, tmp_path / "job")
  checkpoints = _copies_of_step_2(job)
  before = tree_digest(job)
  result = _run(tmp_path, "job", cache, *TRAINED_ARGS, "--fdl.train.steps=6")
  assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
  line = _assert_one_error_line(result.stderr)
  assert line == (
      "lingvo_lite: error: checkpoint step 6 is damaged: its lingvo_lite_checksums.json was "
      "recorded for step 2 (the folder is a copy or a rename of step 2's); move "
      f"{checkpoints / '6'} and {checkpoints / '4'} out of the way to resume from step 2"), line
  assert tree_digest(job) == before
  # Step 6 moved, not 4 (as a user who missed half the advice): step 4 is refused too, by
  # its state's step counter.
  shutil.move(checkpoints / "6", tmp_path / "copy_6")
  result = _in_process(job, cache, *TRAINED_ARGS, "--fdl.train.steps=6")
  assert result.code == 2, result
  assert result.stderr.strip().splitlines() == [
      "lingvo_lite: error: checkpoint step 4 is damaged: its state's step counter is 2 (the "
      "folder is a copy or a rename of step 2's); move "
      f"{checkpoints / '4'} out of the way to resume from step 2"], result.stderr
  # The advice works: the run resumes from step 2 and ends as the uninterrupted one.
  shutil.move(checkpoints / "4", tmp_path / "copy_4")
  result = _in_process(job, cache, *TRAINED_ARGS, "--fdl.train.steps=6")
  assert result.code == 0, result.stderr[-3000:]
  assert "resumed from step 2" in result.stdout
  _assert_ends_as(job, trained_job)


def test_the_advice_after_a_divergence_names_no_damaged_step(tmp_path, trained_job):
  # Healthy by the rows, steps 6 and 4 are copies of step 2's folder (6 with checksums that
  # say so, 4 with checksums from before they named their step): step 2 is the one to name.
  job = _copy_job(trained_job, tmp_path / "job")
  checkpoints = _copies_of_step_2(job)
  rows = [{"step": step, "loss": 2.0} for step in range(1, 8)] + [{"step": 8, "loss": 1e9}]
  checkpointer = Checkpointer(epath.Path(checkpoints), CheckpointSettings(), create=False)
  advice = failures.resume_advice(checkpointer, health.TrainingHealth(rows), checkpoints)
  assert advice.startswith(f"the newest healthy checkpoint is step 2 ({'healthy: '}"), advice
  assert f"); steps 4 and 6 are damaged: move them out of {checkpoints} to resume from step 2," \
      in advice, advice
  checkpointer.close()


def test_an_older_step_folder_that_is_not_the_jobs_own_is_named_and_never_deleted(
    tmp_path, cache, trained_job, caplog):
  # Step 2 copied in from another job (its record names that job), step 4 from an older
  # version's run (a record from before records named their step): the resumed run names each
  # once, resumes from step 6, and retention (max_to_keep=1) deletes only the job's own steps.
  job = _copy_job(trained_job, tmp_path / "job")
  checkpoints = job / "checkpoints"
  record = checkpoints / "2" / checkpoint_integrity.CHECKSUMS_FILE
  own_job = checkpoint_integrity.recorded_job(epath.Path(checkpoints / "2"))
  record.write_text(record.read_text().replace(own_job, "0" * len(own_job)))
  _as_before_step_records(checkpoints / "4")
  result = _in_process(job, cache, *TRAINED_ARGS, "--fdl.train.steps=10",
                       "--fdl.checkpoint.max_to_keep=1")
  assert result.code == 0, result.stderr[-3000:]
  assert "resumed from step 6" in result.stdout
  warnings = [r.getMessage() for r in caplog.records]  # absl's, in this process.
  for step, why in ((2, "was recorded by another job"), (4, "is of record format 1, not 3")):
    named = [line for line in warnings if f"{checkpoints / str(step)}" in line]
    assert len(named) == 1, warnings
    assert f"checkpoint step {step} (" in named[0] and why in named[0], named
    assert f"move it out of {checkpoints} (or delete it)" in named[0], named
  # Steps 6 and 8 are the job's own: 6 goes once step 8 is the newest healthy one (its first
  # loss after it is logged), and 8 stays as that one.
  assert _complete_steps(job) == [2, 4, 8, 10]


# 10. A hang-up (the terminal closed, an ssh session dropped) saves, says so, exits 0.

def test_a_hang_up_saves_says_so_in_the_jobs_log_and_exits_0(tmp_path, cache, trained_job):
  """(Under a multi-process run's supervising parent, which passes the hang-up on:
  tests/runtime/test_hangup.py.)"""
  # Saves every step, synchronously: the hang-up at step 1 lands long before step 6.
  argv = _argv("job", cache, [*TRAINED_ARGS, "--fdl.train.steps=6",
                              "--fdl.checkpoint.every_steps=1",
                              "--fdl.checkpoint.async_save=False"])
  with Terminal(argv[1:], cwd=tmp_path, env=_env()) as terminal:
    terminal.wait_for(b"train step 1/6")
    code = terminal.hang_up()  # The kernel sends the run SIGHUP; the terminal is gone.
  shown = terminal.shown
  job = tmp_path / "job"
  assert code == 0, (code, shown.decode(errors="replace")[-3000:])
  log = (job / "train.log").read_text().splitlines()
  assert len(log) == 1, log
  stopped = re.fullmatch(r"\S+ \S+ pid \d+: SIGHUP: saved step (\d) and stopped; rerun the same "
                         r"command to resume", log[0])
  assert stopped and 1 <= int(stopped[1]) < 6, log
  saved = int(stopped[1])
  # Verified, with the rows up to it and no more; no lock, nothing half written.
  assert _complete_steps(job)[-1] == saved
  assert checkpoint_integrity.first_mismatch(epath.Path(job / "checkpoints" / str(saved))) is None
  assert _curve(job) == _curve(trained_job)[:saved]
  assert not (job / ".lingvo_lite.lock").exists()
  assert _leftovers(job) == []
  # The same command resumes and ends as the uninterrupted run.
  result = _in_process(job, cache, *TRAINED_ARGS, "--fdl.train.steps=6")
  assert result.code == 0, result.stderr[-3000:]
  assert f"resumed from step {saved}" in result.stdout
  _assert_ends_as(job, trained_job)


# 11, 12. A resumed run on a full disk, with entries in checkpoints/ that the program did not
# write: those are moved aside or left alone, never removed; and its first checkpoint commit
# fails, leaving exactly the rows up to its verified step (not the killed run's past it, no
# row twice).

@pytest.fixture(scope="module")
def resumed_on_a_full_disk(tmp_path_factory, cache, trained_job):
  """trained_job resumed from step 4 on a disk with room for rows and events but not for a
  checkpoint: step 6's checkpoint is gone and its rows are there, as a kill between logging
  step 6 and committing its checkpoint leaves a job; beside the steps lie a user's file where
  step 6's folder goes, a partial copy of a step, a file and a folder of other names, and the
  program's own leftovers (an orbax temporary folder, an interrupted delete).

  Returns:
    (the failed run, a copy of the job as it left it, that copy after the same command).
  """
  cwd = tmp_path_factory.mktemp("resumed_on_a_full_disk")
  with small_disk.for_test(cwd / "disk", "8m") as disk:
    job = _copy_job(trained_job, disk.path / "job")
    checkpoints = job / "checkpoints"
    shutil.rmtree(checkpoints / "6")
    (checkpoints / "6").write_text("my notes")  # Where orbax would save step 6 over it.
    (checkpoints / "8" / "default").mkdir(parents=True)  # A partial copy: no orbax metadata.
    (checkpoints / f"7.{TMP_MARKER}").write_text("not a folder orbax left")
    (checkpoints / "notes").mkdir()
    (checkpoints / "notes" / "a.txt").write_text("kept")
    for leftover in (f"9.{TMP_MARKER}/default.{TMP_MARKER}", "3.lingvo_lite-deleting-1/default"):
      (checkpoints / leftover).mkdir(parents=True)  # Small: removing them frees no room.
      (checkpoints / leftover / "_METADATA").write_text("{}")
    disk.fill(free_pages=64)  # Room for rows and events (256 KB), not for a checkpoint (1 MB).
    failed = _run(cwd, "disk/job", cache, *TRAINED_ARGS, "--fdl.train.steps=6", disk=disk)
    left = _copy_job(job, cwd / "left")
  recovered = _copy_job(left, cwd / "recovered")
  rerun = _in_process(recovered, cache, *TRAINED_ARGS, "--fdl.train.steps=6")
  assert rerun.code == 0, rerun.stderr[-3000:]
  assert "resumed from step 4" in rerun.stdout
  return failed, left, recovered


def test_what_the_program_did_not_write_is_moved_aside_not_removed(resumed_on_a_full_disk):
  failed, left, recovered = resumed_on_a_full_disk
  warnings = [line for line in failed.stderr.splitlines() if "moved it to" in line]
  assert len(warnings) == 3, failed.stderr[-3000:]
  for job in (left, recovered):
    checkpoints = job / "checkpoints"
    names = sorted(os.listdir(checkpoints))
    aside = {n.split(".unverified-")[0]: checkpoints / n for n in names if ".unverified-" in n}
    assert sorted(aside) == ["6", f"7.{TMP_MARKER}", "8"], names
    assert aside["6"].read_text() == "my notes"
    assert aside[f"7.{TMP_MARKER}"].read_text() == "not a folder orbax left"
    assert os.listdir(aside["8"]) == ["default"]
    assert (checkpoints / "notes" / "a.txt").read_text() == "kept"
    # The program's own leftovers are gone; the steps are 2 and 4, and 6 once it is saved.
    steps = [n for n in names if n.isdigit()]
    assert steps == (["2", "4"] if job == left else ["2", "4", "6"]), names
    assert sorted(set(names) - {p.name for p in aside.values()} - set(steps)) == ["notes"]
  assert any(f"{left.parent / 'disk' / 'job' / 'checkpoints' / '6'} is a file where orbax "
             "keeps a checkpoint folder; training resumes from step 4; moved it to " in w
             for w in warnings), warnings


def test_a_full_disk_at_a_resumed_runs_first_commit_leaves_the_rows_up_to_its_step(
    resumed_on_a_full_disk, trained_job):
  failed, left, recovered = resumed_on_a_full_disk
  assert failed.returncode == 1, (failed.returncode, failed.stderr[-3000:])
  assert "resumed from step 4" in failed.stdout
  line = _assert_one_error_line(failed.stderr)
  assert re.search(r"saving checkpoint step 6 failed: .*No space left on device.*; training "
                   r"stopped, and the newest checkpoint is step 4: free space", line), line
  assert _complete_steps(left) == [2, 4]
  # The rows (and TensorBoard points) of the uninterrupted run up to step 4, once each.
  assert _curve(left) == _curve(trained_job)[:4]
  assert _eval_rows(left) == []  # The uninterrupted run evaluated step 6 alone.
  assert _tensorboard_losses(left) == _tensorboard_losses(trained_job)[:4]
  assert not [p for p in _leftovers(left) if ".unverified-" not in p]
  # The same command ends as the uninterrupted run.
  _assert_ends_as(recovered, trained_job)
  assert _tensorboard_losses(recovered) == _tensorboard_losses(trained_job)
