"""The train loop: from the starting state to the last save and evaluation, one step at a
time, each followed by what is due after it (a log row, an evaluation, a stop, a save)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, Iterator

import jax
from etils import epath

from lingvo_lite.checkpoints import health as checkpoint_health
from lingvo_lite.checkpoints.manager import Checkpointer
from lingvo_lite.data.prefetch import Prefetcher
from lingvo_lite.experiment import Setup
from lingvo_lite.on_mesh import evaluation
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.programs.train.failures import NonFinite, check_finite
from lingvo_lite.programs.train.run_outputs import RunOutputs
from lingvo_lite.runtime import summaries
from lingvo_lite.runtime.stop_request import StopRequest
from lingvo_lite.runtime.watchdog import Watchdog

# Where a profiler trace goes: the train run's TensorBoard folder, so the printed
# `tensorboard --logdir=JOB/summaries` shows it (jax writes it under plugins/profile/).
PROFILE_DIR = "summaries/train"


@dataclasses.dataclass(frozen=True)
class TrainResult:
  step: int
  train_loss: float | None
  eval_results: evaluation.SetResults | None  # By eval set name.
  interrupted: bool


class TrainLoop:
  """The loop of `run`, from the starting state to the last save and evaluation.

  One object holds what the loop changes as it goes (the state, the step reached, the last
  train loss, whether a profile is being traced), so that each part of a step is a method
  named for what it does and `run` reads as the loop's plan, top to bottom.
  """

  def __init__(self, *, setup: Setup, jitted: JittedSteps, checkpointer: Checkpointer,
               outputs: RunOutputs, health: checkpoint_health.TrainingHealth,
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
      train_step = compiled(self._jitted)
    self._say(f"compiled the train step in {time.perf_counter() - started:.1f} s")
    return train_step

  def _run_steps(self, train_step: Callable[..., Any], stopped: bool) -> None:
    """The steps from the starting one to the last, each followed by what is due after it:
    a log row, an evaluation, a stop, a save."""
    settings = self._settings
    prefetcher = Prefetcher(self._setup.train_data, self._start, settings.steps,
                            *self._jitted.data_block)
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
        # Asked every step (every process at the same point); a stop waits for a step the
        # objective can resume from exactly (GRPO: a rollout's last update).
        if self._stop.should_stop(step) and settings.objective.can_stop_after(step):
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
      self._state, metrics = train_step(self._state,
                                        self._jitted.training_batch(local_batch, self._state))
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
    check_finite(values["loss"], step)
    self._throughput.add_data_wait(prefetcher.wait_seconds)
    prefetcher.wait_seconds = 0.0
    values.update(self._throughput.report(step))
    self._outputs.write_train(step, values)
    self._train_loss = values["loss"]
    grad_norm = f"grad_norm {values['grad_norm']:.3f}  " if "grad_norm" in values else ""
    off_steps = ", ".join(f"{kind} {values[f'{kind}_s']:.2f} s"
                          for kind in summaries.Throughput.OFF_STEP_KINDS
                          if values[f"{kind}_s"] > 0)
    own = self._settings.objective.train_summary(values)
    self._say(f"train step {step}/{self._settings.steps}: loss {values['loss']:.4f}  {own}"
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

  def _evaluate(self) -> evaluation.SetResults | None:
    """Every eval set on the current parameters (off the steps), written and printed."""
    if not self._setup.eval_sets:
      return None
    step = self._step
    with self._off_step("eval"):
      results = evaluation.evaluate_sets(self._jitted, self._state.params, self._setup.eval_sets,
                                         frozen=self._state.frozen)
      self._outputs.write_eval(step, results)
    for name, metrics in results.items():
      self._say(f"eval  step {step} {name}: {results.summary(name)}  "
                f"({metrics['seconds']:.1f} s, {metrics['tokens_per_s']:,.0f} tokens/s)")
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
      saved = self._state.checkpointed()  # Frozen parameters are loaded, never saved.
      if not bool(self._jitted.state_is_finite(saved)):
        raise NonFinite(f"the training state (parameters or optimizer moments) is not "
                         f"finite at step {step}; stopped without saving it", step)
      self._checkpointer.save(step, saved, force=force,
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
      line = f"{self._stop.signal_name}: {done}; rerun the same command to resume"
      self._outputs.note(line)  # First: after a hang-up, the terminal is gone.
      self._say(line)
    else:
      eval_results = self._evaluate()
      self._outputs.commit(step)  # Of the saved state: it supersedes the one resumed after.
    return TrainResult(step=step, train_loss=self._train_loss, eval_results=eval_results,
                       interrupted=self._stop.signal_name is not None)


def compiled(jitted: JittedSteps) -> Callable[..., Any]:
  """The jitted train step compiled ahead of time from the state's and the batch's shapes
  (the lowering --mode=compile compiles): what its first call would compile."""
  return jitted.lower_train_step().compile()
