"""The train program: init or resume, then step, log, evaluate and checkpoint until done.

Resume is exact: the state comes back from the latest checkpoint and the data source
yields the batch of a step as a function of (seed, step), so a stopped-and-resumed run
computes the same losses as an uninterrupted one. SIGTERM or SIGINT saves and stops
cleanly (exit code 0); rerunning the same command continues.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

import jax
from absl import logging
from etils import epath

from lingvo_lite import evaluation, memory_fit, mfu
from lingvo_lite.checkpoints import health as checkpoint_health
from lingvo_lite.checkpoints.errors import CheckpointWriteError
from lingvo_lite.checkpoints.manager import Checkpointer
from lingvo_lite.config import files as config_files
from lingvo_lite.data.prefetch import Prefetcher
from lingvo_lite.errors import UsageError, os_error_text
from lingvo_lite.experiment import Setup
from lingvo_lite.jitted import JittedSteps
from lingvo_lite.programs import Invocation, ProgramFailure, summarize_changes
from lingvo_lite.programs.options import option
from lingvo_lite.runtime import lock as job_lock, run_info, summaries
from lingvo_lite.runtime.job_dirs import FILE, FOLDER, JobFiles
from lingvo_lite.runtime.stop_request import StopRequest
from lingvo_lite.runtime.watchdog import Watchdog

# Where a profiler trace goes: the train run's TensorBoard folder, so the printed
# `tensorboard --logdir=JOB/summaries` shows it (jax writes it under plugins/profile/).
PROFILE_DIR = "summaries/train"


@dataclasses.dataclass(frozen=True)
class Options:
  """The flag of --mode=train."""

  compiled_step_in: str | None = option(
      None, "--mode=train: run the compiled step saved at this folder instead of compiling; "
      "refused (one line) if anything it was compiled for differs. A saved step is code: load "
      "only your own.")


# The job dir, created where missing: config, checkpoints, metrics and run info, TensorBoard
# summaries, stack dumps, the job's lock, each eval set's rows; a profiler trace if asked for.
JOB_FILES = JobFiles(
    creates=True,
    written=(("checkpoints", FOLDER), ("summaries", FOLDER), (PROFILE_DIR, FOLDER),
             (config_files.CONFIG_JSON, FILE), (config_files.CONFIG_TXT, FILE),
             ("metrics.jsonl", FILE), (run_info.FILE_NAME, FILE), ("stacks", FOLDER),
             (job_lock.LOCK_NAME, FILE)),
    eval_sets_under="",
    when_profiling=((f"{PROFILE_DIR}/plugins", FOLDER),
                    (f"{PROFILE_DIR}/plugins/profile", FOLDER)))


class TrainingFailure(ProgramFailure):
  """The run started but cannot go on (exit code 1): a non-finite loss, for instance."""


@dataclasses.dataclass(frozen=True)
class TrainResult:
  step: int
  train_loss: float | None
  eval_results: dict[str, dict[str, float]] | None  # By eval set name.
  interrupted: bool


class OutputWriteError(TrainingFailure):
  """A file of the job dir besides the checkpoints (config, metrics, run info) could not be
  written: one line naming it and the operating system's reason (`errno`)."""

  def __init__(self, message: str, error_number: int | None):
    super().__init__(message)
    self.errno = error_number


@contextlib.contextmanager
def _writing_outputs() -> Iterator[None]:
  try:
    yield
  except OSError as e:
    reason = " ".join((e.strerror or str(e) or type(e).__name__).split())
    code = f" (errno {e.errno})" if e.errno else ""
    raise OutputWriteError(f"writing {e.filename or 'the job dir'} failed: {reason}{code}",
                           e.errno) from e


def _write_advice(error_number: int | None) -> str:
  """How to go on after a failed write, by its errno (the disk is full: free space)."""
  if not error_number:
    return "free space or fix the job folder's permissions, then rerun the same command"
  _, fix = os_error_text(OSError(error_number, os.strerror(error_number)),
                         "move the job folder where it can be written")
  return f"{fix}, then rerun the same command"


class _RunOutputs:
  """What a run writes into its job dir besides checkpoints: the config, the metrics and the
  run's identity (a row of `run_info.jsonl`).

  What a run writes is the job's once the checkpoint it belongs to is verified, and only then:
  `Checkpointer.on_verified` calls `commit(step)`, whichever path verifies the step, and the
  metric rows up to that step are kept whatever happens next; the first commit also rewrites
  an existing job's config and drops the metric rows past the restored step (a killed run's).
  A run that fails calls `rollback`, which takes back the rows past its last commit (all of
  them, and its run-info row, before the first), leaving the job as the last verified
  checkpoint left it. A new job's config is written at once: there is nothing to protect.

  Every write raises OutputWriteError (one line naming the file); `rollback` raises nothing.
  """

  def __init__(self, job_dir: epath.Path, start: int, job_is_new: bool,
               record_config: Callable[[], None], enabled: bool, eval_sets: list[str],
               jitted: JittedSteps, command_line: Sequence[str] | None):
    self._record_config = record_config
    # A new job's config is written below, an existing job's at the first commit.
    self._config_recorded = job_is_new
    resumed_from = None if job_is_new else start
    with _writing_outputs():
      self.train = summaries.MetricsWriter(job_dir / "metrics.jsonl", job_dir / "summaries" /
                                           "train", enabled=enabled, resumed_from=resumed_from)
      self.eval = evaluation.SetWriters(job_dir, eval_sets, enabled=enabled,
                                        resumed_from=resumed_from)
      if job_is_new:
        record_config()
      self.run_info = run_info.RunInfoWriter(job_dir, enabled=enabled)
      if enabled:
        config = job_dir / config_files.CONFIG_JSON
        self.run_info.append(run_info.collect(
            start, jitted.target.devices, dict(jitted.mesh.shape), jax.process_count(),
            config_files.recorded_experiment(config) if config.exists() else None,
            command_line))

  def write_train(self, step: int, values: dict[str, float]) -> None:
    with _writing_outputs():
      self.train.write(step, values)

  def write_eval(self, step: int, results: dict[str, dict[str, float]]) -> None:
    with _writing_outputs():
      self.eval.write(step, results)

  def commit(self, step: int) -> None:
    """The rows up to `step` are kept from now on; then what the first commit rewrites."""
    self.run_info.commit()
    # Kept first, written after: a failed write below takes none of these rows back.
    with _writing_outputs():
      try:
        self.train.commit(step)
      finally:
        self.eval.commit(step)
      if not self._config_recorded:
        self._config_recorded = True  # Tried once: a failure stops the run.
        self._record_config()

  def rollback(self) -> None:
    """Takes back what no verified checkpoint covers; a failure to is a warning (the run's own
    failure is the one to report)."""
    for part in (self.train, self.eval, self.run_info):
      try:
        part.rollback()
      except OSError as e:
        logging.warning("could not take back what this run wrote to %s: %s", e.filename,
                        e.strerror or e)

  def close(self) -> None:
    with _writing_outputs():
      try:
        self.train.close()
      finally:
        self.eval.close()


def main(invocation: Invocation) -> None:
  """The train program: under the job's lock, checks the job's config, trains, summarizes."""
  setup, job_dir = invocation.setup, invocation.job_dir
  is_chief = jax.process_index() == 0
  setup.check_data()  # An empty data source is one line now, not a failure mid-run.
  # The lock first: what the job holds (its config, its checkpoints) is read under it.
  lock = job_lock.JobLock(job_dir, enabled=is_chief, shown=invocation.shown_job_dir)
  with lock:
    changes = invocation.config_changes()
    if changes:
      raise UsageError(
          f"--job_log_dir={invocation.shown_job_dir}: the config differs from the one this "
          f"job was trained with ({summarize_changes(changes)}); resume with the same config "
          "or use a new --job_log_dir")
    job_is_new = not (job_dir / "config.json").exists()
    record_config = invocation.write_config if is_chief else lambda: None
    result = run(setup, job_dir, record_config, job_is_new,
                 compiled_step_in=invocation.options.compiled_step_in,
                 command_line=invocation.command_line)
  if is_chief:
    print(_summary(result, setup.eval_sets, epath.Path(invocation.shown_job_dir)), flush=True)


def _summary(result: TrainResult, eval_sets: Iterable[str], shown: epath.Path) -> str:
  """The lines a finished run ends with: where it stopped, its final losses, and where its
  files are (the eval sets' by name), under the job dir as the user wrote it (`shown`)."""
  lines = [f"done: step {result.step}" + (" (stopped by signal)" if result.interrupted else "")]
  if result.train_loss is not None:
    lines.append(f"  final train loss: {result.train_loss:.4f}")
  for name, metrics in (result.eval_results or {}).items():
    label = "final eval loss: " if len(result.eval_results) == 1 else f"final eval loss ({name}):"
    lines.append(f"  {label} {metrics['loss']:.4f} ({metrics['bits_per_token']:.4f} bits/token"
                 + (f", {metrics['bits_per_byte']:.4f} bits/byte)"
                    if "bits_per_byte" in metrics else ")"))
  eval_files = ", ".join(str(evaluation.jsonl_path(shown, name)) for name in eval_sets)
  lines += [f"  config:      {shown / 'config.txt'} (reload: "
            f"--fdl_config_file={shown / 'config.json'})",
            f"  checkpoints: {shown / 'checkpoints'}",
            f"  metrics:     {shown / 'metrics.jsonl'}" + (f", {eval_files}" if eval_files
                                                         else ""),
            f"  TensorBoard: tensorboard --logdir={shown / 'summaries'}"]
  return "\n".join(lines)


def _newest_checkpoint(checkpointer: Checkpointer) -> str:
  """Where a rerun would resume, for the messages of a failed run."""
  try:
    step = checkpointer.latest_step()
  except UsageError:
    step = None
  return (f"the newest checkpoint is step {step}" if step is not None
          else "no checkpoint was saved yet")


def run(setup: Setup, job_dir: epath.Path,
        record_config: Callable[[], None] = lambda: None,
        job_is_new: bool = True, compiled_step_in: str | None = None,
        command_line: Sequence[str] | None = None) -> TrainResult:
  """Trains `setup` in `job_dir`, resuming from its latest verified checkpoint if any.

  Nothing in an existing `job_dir` changes until the starting state is in hand (initialized,
  or restored and verified), and what the run writes after that stays only if it saves a
  checkpoint (see `_RunOutputs`).

  Args:
    compiled_step_in: A folder written by `--mode=compile --compiled_step_out`: its step
      replaces the jitted one once its manifest matches this setup and host.
    command_line: The command line the run's row of run_info.jsonl records (the executor's
      Invocation.command_line); None records sys.argv.

  Raises:
    TrainingFailure: a non-finite loss or state, or a failed save (one-line message).
    UsageError: the saved step was compiled for something else.
  """
  memory_fit.check_fits(setup)  # Before anything is allocated or written.
  is_chief = jax.process_index() == 0
  jitted = JittedSteps(setup)
  if compiled_step_in is not None:
    from lingvo_lite.programs.compile import compiled_steps  # pylint: disable=g-import-not-at-top
    jitted.train_step = compiled_steps.load(compiled_step_in, jitted)
  checkpointer = Checkpointer(job_dir / "checkpoints", setup.checkpoint)
  say = lambda message: summaries.log(message, is_chief)

  # Each process watches its own steps: stack dumps into JOB/stacks when they stop coming.
  watchdog = Watchdog(setup.watchdog, job_dir / "stacks", jax.process_count())
  with jitted.activated(), StopRequest() as stop, watchdog:
    start = checkpointer.latest_step(warn=False)  # clean_up_for_training says what it skips.
    # Before the restore and the compile, which can take minutes: a stop asked for meanwhile
    # must name a step after `start` (see StopRequest.should_stop).
    stopped_before_first_step = stop.should_stop(start or 0)
    with watchdog.excused("restore"):  # With the start-up: the writers import TensorBoard.
      state, start = _restore_or_init(jitted, checkpointer, start, job_dir, say)
      checkpointer.clean_up_for_training(start)
      try:
        outputs = _RunOutputs(job_dir, start, job_is_new, record_config, enabled=is_chief,
                              eval_sets=list(setup.eval_sets), jitted=jitted,
                              command_line=command_line)
      except OutputWriteError as e:
        raise TrainingFailure(f"{e}; {_write_advice(e.errno)}") from e
      # The health of the steps saved so far: from the rows of the verified checkpoints.
      health = checkpoint_health.TrainingHealth(
          summaries.read_rows(job_dir / "metrics.jsonl", lambda step: step <= start)
          if is_chief and not job_is_new else ())
    # The outputs a checkpoint covers are kept the moment it is verified, on every path; and
    # retention keeps the step a diverged run would be told to resume from.
    checkpointer.on_verified = outputs.commit
    checkpointer.also_keep = health.newest_healthy
    try:
      throughput = _start_meter(setup, jitted, state, start, watchdog, say)
      loop = _TrainLoop(setup=setup, jitted=jitted, checkpointer=checkpointer, outputs=outputs,
                        health=health, throughput=throughput, stop=stop, watchdog=watchdog,
                        job_dir=job_dir, say=say, state=state, start=start)
      result = loop.run(stopped_before_first_step)
      outputs.close()
    except (TrainingFailure, CheckpointWriteError) as e:
      raise _failure_after_start(e, checkpointer, outputs, health, job_dir) from e
    except BaseException:
      outputs.rollback()  # An internal error or an interrupt: it goes on as it is.
      raise
  return result


def _restore_or_init(jitted: JittedSteps, checkpointer: Checkpointer, start: int | None,
                     job_dir: epath.Path, say: Callable[[str], None]) -> tuple[Any, int]:
  """The state to start from and its step: checkpoint `start` restored (and verified), or a
  new state at step 0 when the job has no checkpoint."""
  if start is None:
    state = jitted.init_state()
    say(f"initialized a new state in {job_dir}")
    return state, 0
  state = jitted.restore_state(checkpointer, start)
  say(f"resumed from step {start} in {job_dir / 'checkpoints'}")
  return state, start


def _failure_after_start(error: TrainingFailure | CheckpointWriteError,
                         checkpointer: Checkpointer, outputs: _RunOutputs,
                         health: checkpoint_health.TrainingHealth,
                         job_dir: epath.Path) -> TrainingFailure:
  """Leaves the job as its last verified checkpoint left it, and says (in one line) what
  stopped the run and how to go on: for a failed write where the run can resume, for a
  divergence which checkpoint is healthy and what to change."""
  try:
    checkpointer.close()  # A good save still pending is verified, and its outputs kept.
  except (CheckpointWriteError, TrainingFailure):
    pass  # The first failure is the one to report.
  outputs.rollback()
  checkpointer.discard_failed_saves()
  # Said after close(): a save still pending when the run stopped is verified by now.
  message = str(error)
  if isinstance(error, (CheckpointWriteError, OutputWriteError)):
    message += (f"; training stopped, and {_newest_checkpoint(checkpointer)}: "
                f"{_write_advice(error.errno)}")
  elif isinstance(error, _NonFinite):
    health.add_failure(error.step)
    message += f"; {_resume_advice(checkpointer, health, job_dir / 'checkpoints')}"
  return TrainingFailure(message)


def _start_meter(setup: Setup, jitted: JittedSteps, state, start: int, watchdog: Watchdog,
                 say: Callable[[str], None]) -> summaries.Throughput:
  """Says the model's size and the batch's layout, then starts the throughput meter: its
  clock starts here, so the compile that follows is counted, off the steps."""
  data, num_devices = setup.train_data, jitted.target.num_devices
  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  mesh_shape = " ".join(f"{axis}={size}" for axis, size in jitted.mesh.shape.items())
  flops = mfu.model_flops_per_step(setup.model, data.global_batch_size, data.sequence_length)
  with watchdog.excused("measuring the peak"):  # On a CPU: a compile and 11 big matmuls.
    peak, peak_source = mfu.peak_flops_per_device(jitted.target.devices[0],
                                                  setup.train.peak_tflops_per_device)
  say(f"model: {num_params / 1e6:.2f}M parameters, {flops / 1e12:.3g} TFLOP per step; "
      f"peak {peak / 1e12:.3g} TFLOP/s per device ({peak_source})")
  say(f"batch: global {data.global_batch_size} x {data.sequence_length} tokens = "
      f"{data.global_batch_size / num_devices:g} per device x {num_devices} devices; "
      f"mesh {mesh_shape}; {jax.process_count()} process(es)")
  tokens_per_step = data.global_batch_size * data.sequence_length
  return summaries.Throughput(start, setup.train.steps, tokens_per_step, flops, num_devices,
                              peak)


class _TrainLoop:
  """The loop of `run`, from the starting state to the last save and evaluation.

  One object holds what the loop changes as it goes (the state, the step reached, the last
  train loss, whether a profile is being traced), so that each part of a step is a method
  named for what it does and `run` reads as the loop's plan, top to bottom.
  """

  def __init__(self, *, setup: Setup, jitted: JittedSteps, checkpointer: Checkpointer,
               outputs: _RunOutputs, health: checkpoint_health.TrainingHealth,
               throughput: summaries.Throughput, stop: StopRequest, watchdog: Watchdog,
               job_dir: epath.Path, say: Callable[[str], None], state, start: int):
    self._setup = setup
    self._settings = setup.train
    self._jitted = jitted
    self._checkpointer = checkpointer
    self._outputs = outputs
    self._health = health
    self._throughput = throughput
    self._stop = stop
    self._watchdog = watchdog
    self._job_dir = job_dir
    self._say = say
    self._state = state
    self._start = start
    self._step = start  # The steps done so far: the step the state is at.
    self._train_loss: float | None = None  # Of the last logged step.
    self._profiling = False

  def run(self, stopped_before_first_step: bool) -> TrainResult:
    """Compiles the step, runs the steps until done or asked to stop, then saves and
    evaluates the last step."""
    train_step = self._jitted.train_step
    # Asked again: a restore takes minutes, and a stop that came meanwhile must not wait for a
    # compile as long (every process gets here at the same point).
    stopped = stopped_before_first_step or self._stop.should_stop(self._start)
    if self._start < self._settings.steps and not stopped:
      train_step = self._compile(train_step)
    self._run_steps(train_step, stopped)
    return self._finish()

  def _compile(self, train_step: Callable[..., Any]) -> Callable[..., Any]:
    """Compiles before the first step, so its time is the compile's, not the step's (and it
    is not spent at all when no step will run: a finished job rerun, a stop asked for during
    the restore). A step loaded with --compiled_step_in is compiled already."""
    if not hasattr(train_step, "lower"):
      return train_step
    with self._off_step("compile"):
      started = time.perf_counter()
      train_step = _compiled(self._jitted)
    self._say(f"compiled the train step in {time.perf_counter() - started:.1f} s")
    return train_step

  def _run_steps(self, train_step: Callable[..., Any], stopped: bool) -> None:
    """The steps from the starting one to the last, each followed by what is due after it:
    a log row, an evaluation, a stop, a save."""
    settings = self._settings
    prefetcher = Prefetcher(self._setup.train_data, self._start, settings.steps,
                            jax.process_index(), jax.process_count())
    try:
      for step_index, local_batch in () if stopped else prefetcher:
        metrics = self._take_step(train_step, step_index, local_batch)
        self._verify_finished_saves()  # A save this run started is verified (or raises).
        self._maybe_stop_profiling()
        step = self._step
        if step % settings.log_every_steps == 0 or step == settings.steps:
          self._log(metrics, prefetcher)
        if settings.eval_every_steps and step % settings.eval_every_steps == 0 and (
            step < settings.steps):
          self._evaluate()
        if self._stop.should_stop(step):
          break
        if step < settings.steps:
          self.save()
    finally:
      prefetcher.close()
      if self._profiling:
        jax.profiler.stop_trace()

  def _take_step(self, train_step: Callable[..., Any], step_index: int, local_batch
                 ) -> dict[str, jax.Array]:
    """One train step, dispatched; its metrics stay on the device until a log row asks."""
    if step_index == self._settings.profile_start_step:
      jax.profiler.start_trace(str(self._job_dir / PROFILE_DIR))
      self._profiling = True
    # Each traced step is marked, so the profile splits into steps.
    with (jax.profiler.StepTraceAnnotation("train", step_num=step_index) if self._profiling
          else contextlib.nullcontext()):
      self._state, metrics = train_step(self._state, self._jitted.global_batch(local_batch))
    self._watchdog.step_done()  # Dispatched (see Watchdog on what that measures).
    self._step = step_index + 1
    return metrics

  def _maybe_stop_profiling(self) -> None:
    """Ends the trace once its window of steps has run, and says where it went."""
    settings, step = self._settings, self._step
    if self._profiling and step >= settings.profile_start_step + settings.profile_steps:
      jax.block_until_ready(self._state)
      jax.profiler.stop_trace()
      self._profiling = False
      self._say(f"profiler trace of steps {settings.profile_start_step}..{step - 1} written to "
                f"{self._job_dir / PROFILE_DIR}/plugins/profile (TensorBoard's Profile tab, "
                "with the optional tensorboard-plugin-profile)")

  def _log(self, metrics: dict[str, jax.Array], prefetcher: Prefetcher) -> None:
    """A row of metrics and throughput, written and printed; a non-finite loss stops the run
    here (after the health records it), before anything of this step is saved."""
    step = self._step
    values = {k: float(v) for k, v in jax.device_get(metrics).items()}
    self._health.add(step, values["loss"], values.get("grad_norm"))
    _check_finite(values["loss"], step)
    self._throughput.add_data_wait(prefetcher.wait_seconds)
    prefetcher.wait_seconds = 0.0
    values.update(self._throughput.report(step))
    self._outputs.write_train(step, values)
    self._train_loss = values["loss"]
    grad_norm = f"grad_norm {values['grad_norm']:.3f}  " if "grad_norm" in values else ""
    off_steps = ", ".join(f"{kind} {values[f'{kind}_s']:.2f} s"
                          for kind in summaries.Throughput.OFF_STEP_KINDS
                          if values[f"{kind}_s"] > 0)
    self._say(f"train step {step}/{self._settings.steps}: loss {values['loss']:.4f}  "
              f"lr {values['learning_rate']:.2e}  {grad_norm}"
              f"{values['steps_per_s']:.2f} steps/s  {values['tokens_per_s']:,.0f} tokens/s  "
              f"{values['model_tflop_per_step']:.3g} TFLOP/step  "
              f"{values['tflops_per_device']:.3g} TFLOP/s/device  MFU {values['mfu']:.1%}  "
              f"data wait {values['data_wait_s'] * 1e3:.0f} ms/step  "
              f"ETA {summaries.format_duration(values['eta_s'])}"
              + (f"  (not counted: {off_steps})" if off_steps else ""))

  @contextlib.contextmanager
  def _off_step(self, kind: str) -> Iterator[None]:
    """Work besides steps (compile, checkpoint, eval): timed and kept out of the step time,
    tokens/s and MFU, and no stall to the watchdog. The steps dispatched so far finish
    first: their time is theirs."""
    jax.block_until_ready(self._state)
    with self._throughput.excluded(kind), self._watchdog.excused(kind):
      yield

  def _evaluate(self) -> dict[str, dict[str, float]] | None:
    """Every eval set on the current parameters (off the steps), written and printed."""
    if not self._setup.eval_sets:
      return None
    step = self._step
    with self._off_step("eval"):
      results = evaluation.evaluate_sets(self._jitted, self._state.params, self._setup.eval_sets)
      self._outputs.write_eval(step, results)
    for name, metrics in results.items():
      self._say(f"eval  step {step} {name}: loss {metrics['loss']:.4f}  "
                f"bits/token {metrics['bits_per_token']:.4f}  "
                + (f"bits/byte {metrics['bits_per_byte']:.4f}  " if "bits_per_byte" in metrics
                   else "")
                + f"accuracy {metrics['accuracy']:.4f}  ({metrics['seconds']:.1f} s, "
                f"{metrics['tokens_per_s']:,.0f} tokens/s)")
    return results

  def save(self, force: bool = False) -> None:
    """Saves the current step if it is due, and only a finite state (one reduction on
    device). The time the loop waits (the check, the copy to host, a previous save still
    writing) is logged and kept out of the step figures; orbax writes the files in the
    background."""
    step = self._step
    if not force and step % self._setup.checkpoint.every_steps:
      return
    with self._off_step("checkpoint"):
      if not bool(self._jitted.state_is_finite(self._state)):
        raise _NonFinite(f"the training state (parameters or optimizer moments) is not "
                         f"finite at step {step}; stopped without saving it", step)
      self._checkpointer.save(step, self._state, force=force,
                              metadata=self._jitted.checkpoint_metadata)

  def _verify_finished_saves(self) -> None:
    """Checksums a save orbax has finished (off the steps); its config and metrics are then
    the job's (`Checkpointer.on_verified`)."""
    if self._checkpointer.save_finished():
      with self._off_step("checkpoint"):
        self._checkpointer.poll()

  def _finish(self) -> TrainResult:
    """Saves the last step and waits for it to be verified; then, unless a signal stopped the
    run, evaluates it and keeps the outputs up to it."""
    step = self._step
    if step > self._start:
      self.save(force=True)
    with self._off_step("checkpoint"):
      self._checkpointer.close()  # Verifies the last save: the outputs up to it are kept.
    eval_results = None
    if self._stop.signal_name:
      done = (f"saved step {step} and stopped" if step > self._start else
              "stopped before its first step, with nothing new to save")
      self._say(f"{self._stop.signal_name}: {done}; rerun the same command to resume")
    else:
      eval_results = self._evaluate()
      self._outputs.commit(step)  # Of the saved state: it supersedes the one resumed after.
    return TrainResult(step=step, train_loss=self._train_loss, eval_results=eval_results,
                       interrupted=self._stop.signal_name is not None)


def _compiled(jitted: JittedSteps) -> Callable[..., Any]:
  """The jitted train step compiled ahead of time from the state's and the batch's shapes
  (the lowering --mode=compile compiles): what its first call would compile."""
  return jitted.lower_train_step().compile()


_NON_FINITE_FIX = ("rerun with a lower optimizer.peak_learning_rate (or a clip_grad_norm, "
                   "longer warmup_steps): a resumed run may change the optimizer's settings")


def _resume_advice(checkpointer: Checkpointer, health: checkpoint_health.TrainingHealth,
                   folder: epath.Path) -> str:
  """Where a diverged run should resume: the newest healthy checkpoint (retention keeps it),
  with the rule that says so and the diverged steps after it to move away."""
  steps = checkpointer.verified_steps()
  if not steps:
    return f"no checkpoint was saved yet; {_NON_FINITE_FIX}"
  healthy = health.newest_healthy(steps)
  rule = f"healthy: {checkpoint_health.RULE}"
  if healthy == steps[-1]:
    return f"the newest checkpoint, step {healthy}, is healthy ({rule}); {_NON_FINITE_FIX}"
  diverged = [step for step in steps if step > (healthy or 0)]
  listed = (f"step {diverged[0]}" if len(diverged) == 1 else
            f"steps {', '.join(map(str, diverged[:-1]))} and {diverged[-1]}"
            if len(diverged) <= 4 else f"the {len(diverged)} steps {diverged[0]} to "
            f"{diverged[-1]}")
  if healthy is None:
    return (f"no checkpoint is healthy ({rule}): {listed} had diverged already; move "
            f"{'it' if len(diverged) == 1 else 'them'} out of {folder} to start over, then "
            f"{_NON_FINITE_FIX}")
  return (f"the newest healthy checkpoint is step {healthy} ({rule}); {listed} after it had "
          f"diverged already: move {'it' if len(diverged) == 1 else 'them'} out of {folder} "
          f"to resume from step {healthy}, then {_NON_FINITE_FIX}")


class _NonFinite(TrainingFailure):
  """A non-finite loss or state at `step`; `run` adds where to resume and what to change."""

  def __init__(self, message: str, step: int):
    super().__init__(message)
    self.step = step


def _check_finite(loss: float, step: int) -> None:
  if not math.isfinite(loss):
    raise _NonFinite(f"loss is {loss} at step {step}; stopped without saving it", step)
