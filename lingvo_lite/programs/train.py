"""The train program: init or resume, then step, log, evaluate and checkpoint until done.

Resume is exact: the state comes back from the latest checkpoint and the data source
yields the batch of a step as a function of (seed, step), so a stopped-and-resumed run
computes the same losses as an uninterrupted one. SIGTERM or SIGINT saves and stops
cleanly (exit code 0); rerunning the same command continues.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import threading
from typing import Callable

import jax
from absl import logging
from etils import epath
from jax._src import distributed as jax_distributed  # The preemption service's state.
from jax.experimental import multihost_utils

from lingvo_lite import memory_fit, mfu, summaries
from lingvo_lite.checkpoints import Checkpointer
from lingvo_lite.data.prefetch import Prefetcher
from lingvo_lite.experiment import Setup
from lingvo_lite.programs.jitted import JittedSteps


class TrainingFailure(RuntimeError):
  """The run started but cannot go on (exit code 1): a non-finite loss, for instance."""


@dataclasses.dataclass(frozen=True)
class TrainResult:
  step: int
  train_loss: float | None
  eval_metrics: dict[str, float] | None
  interrupted: bool


class _StopRequest:
  """SIGTERM or SIGINT stops the run between steps, at the same step in every process.

  One process: the signal sets a flag the loop reads. Several processes: each may be
  signalled at a different step (or only one may be), so JAX's preemption service, which
  catches SIGTERM itself and shares the notice through the coordination service, picks the
  step they all stop after; SIGINT is passed on to it as a SIGTERM.
  """

  def __init__(self):
    self.signal_name: str | None = None
    self._previous = {}
    self._shared = jax.process_count() > 1 and getattr(
        jax_distributed.global_state, "preemption_sync_manager", None) is not None
    if jax.process_count() > 1 and not self._shared:
      logging.warning("JAX's preemption service is off (jax_enable_preemption_service): a "
                      "SIGTERM must reach every process before the same step")

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for signum in (signal.SIGINT,) if self._shared else (signal.SIGTERM, signal.SIGINT):
        self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def _handle(self, signum, frame):
    del frame
    if self._shared:
      os.kill(os.getpid(), signal.SIGTERM)
    else:
      self.signal_name = signal.Signals(signum).name

  def should_stop(self, step: int) -> bool:
    """Called by every process with the starting step, then after every step.

    JAX's preemption service counts steps from 0 and stops at one past the highest step it
    has been told of: without the starting step, a stop asked for before a resumed run
    finished its first step would name step 1, which never comes. (A SIGTERM in the seconds
    between jax.distributed.initialize and the first call is still lost that way.)
    """
    if self._shared and multihost_utils.reached_preemption_sync_point(step):
      self.signal_name = "SIGTERM"
    return self.signal_name is not None

  def __exit__(self, *exc):
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)


def _check_finite(loss: float, step: int, checkpointer: Checkpointer) -> None:
  if not math.isfinite(loss):
    checkpointer.close()  # Finishes the pending save of a good step, with its checksums.
    raise TrainingFailure(
        f"loss is {loss} at step {step}; stopped without saving. The last good checkpoint "
        f"is step {checkpointer.latest_step()}; lower optimizer.peak_learning_rate or set "
        "optimizer.clip_grad_norm and rerun")


def run(setup: Setup, job_dir: epath.Path,
        record_config: Callable[[], None] = lambda: None) -> TrainResult:
  """Trains `setup` in `job_dir`, resuming from its latest checkpoint if there is one.

  Nothing in an existing `job_dir` changes until the starting state is in hand (initialized,
  or restored and verified): only then does `record_config` run and do the metric writers
  open, so a run that cannot start leaves the job as it was. (A new job dir gets its empty
  `checkpoints/` first.)
  """
  memory_fit.check_fits(setup)  # Before anything is allocated or written.
  is_chief = jax.process_index() == 0
  jitted = JittedSteps(setup)
  loop = setup.train
  tokens_per_step = setup.train_data.global_batch_size * setup.train_data.sequence_length
  checkpointer = Checkpointer(job_dir / "checkpoints", setup.checkpoint)
  say = lambda message: summaries.log(message, is_chief)

  with jitted.activated(), _StopRequest() as stop:
    start = checkpointer.latest_step()
    # Before the restore and the compile, which can take minutes: a stop asked for meanwhile
    # must name a step after `start` (see _StopRequest.should_stop).
    stopped_before_first_step = stop.should_stop(start or 0)
    if start is None:
      start = 0
      state = jitted.init_state()
      say(f"initialized a new state in {job_dir}")
    else:
      state = jitted.restore_state(checkpointer, start)
      say(f"resumed from step {start} in {job_dir / 'checkpoints'}")
    record_config()
    checkpointer.discard_incomplete_steps()
    train_writer = summaries.MetricsWriter(
        job_dir / "metrics.jsonl", job_dir / "summaries" / "train", enabled=is_chief)
    eval_writer = summaries.MetricsWriter(
        job_dir / "eval_metrics.jsonl", job_dir / "summaries" / "eval", enabled=is_chief)

    def evaluate(params, step: int) -> dict[str, float] | None:
      if setup.eval_data is None:
        return None
      metrics = jitted.evaluate(params, setup.eval_data)
      eval_writer.write(step, metrics)
      say(f"eval  step {step}: loss {metrics['loss']:.4f}  "
          f"bits/token {metrics['bits_per_token']:.4f}  accuracy {metrics['accuracy']:.4f}")
      return metrics

    num_params = sum(x.size for x in jax.tree.leaves(state.params))
    data, num_devices = setup.train_data, jax.device_count()
    mesh_shape = " ".join(f"{axis}={size}" for axis, size in jitted.mesh.shape.items())
    flops = mfu.model_flops_per_step(setup.model, data.global_batch_size, data.sequence_length)
    peak, peak_source = mfu.peak_flops_per_device(jax.devices()[0], loop.peak_tflops_per_device)
    say(f"model: {num_params / 1e6:.2f}M parameters, {flops / 1e12:.3g} TFLOP per step; "
        f"peak {peak / 1e12:.3g} TFLOP/s per device ({peak_source})")
    say(f"batch: global {data.global_batch_size} x {data.sequence_length} tokens = "
        f"{data.global_batch_size / num_devices:g} per device x {num_devices} devices; "
        f"mesh {mesh_shape}; {jax.process_count()} process(es)")

    throughput = summaries.Throughput(start, loop.steps, tokens_per_step, flops, num_devices,
                                      peak)
    prefetcher = Prefetcher(setup.train_data, start, loop.steps, jax.process_index(),
                            jax.process_count())
    profiling = False
    train_loss = None
    eval_metrics = None
    step = start
    metrics = None
    try:
      for step_index, local_batch in () if stopped_before_first_step else prefetcher:
        if step_index == loop.profile_start_step:
          jax.profiler.start_trace(str(job_dir / "profile"))
          profiling = True
        state, metrics = jitted.train_step(state, jitted.global_batch(local_batch))
        step = step_index + 1
        if profiling and step >= loop.profile_start_step + loop.profile_steps:
          jax.block_until_ready(state)
          jax.profiler.stop_trace()
          profiling = False
          say(f"profiler trace of steps {loop.profile_start_step}..{step - 1} written to "
              f"{job_dir / 'profile'}")

        if step % loop.log_every_steps == 0 or step == loop.steps:
          values = {k: float(v) for k, v in jax.device_get(metrics).items()}
          _check_finite(values["loss"], step, checkpointer)
          throughput.add_data_wait(prefetcher.wait_seconds)
          prefetcher.wait_seconds = 0.0
          values.update(throughput.report(step))
          train_writer.write(step, values)
          train_loss = values["loss"]
          grad_norm = f"grad_norm {values['grad_norm']:.3f}  " if "grad_norm" in values else ""
          say(f"train step {step}/{loop.steps}: loss {values['loss']:.4f}  "
              f"lr {values['learning_rate']:.2e}  {grad_norm}"
              f"{values['steps_per_s']:.2f} steps/s  {values['tokens_per_s']:,.0f} tokens/s  "
              f"{values['model_tflop_per_step']:.3g} TFLOP/step  "
              f"{values['tflops_per_device']:.3g} TFLOP/s/device  MFU {values['mfu']:.1%}  "
              f"data wait {values['data_wait_s'] * 1e3:.0f} ms/step  "
              f"ETA {summaries.format_duration(values['eta_s'])}")

        if loop.eval_every_steps and step % loop.eval_every_steps == 0 and step < loop.steps:
          evaluate(state.params, step)
        if stop.should_stop(step):
          break
        if step % setup.checkpoint.every_steps == 0 and step < loop.steps:
          _check_finite(float(metrics["loss"]), step, checkpointer)
          checkpointer.save(step, state, metadata=jitted.checkpoint_metadata)
    finally:
      prefetcher.close()
      if profiling:
        jax.profiler.stop_trace()

    if step > start:
      _check_finite(float(metrics["loss"]), step, checkpointer)
      checkpointer.save(step, state, force=True, metadata=jitted.checkpoint_metadata)
    checkpointer.close()
    if stop.signal_name:
      say(f"{stop.signal_name}: saved step {step} and stopped; rerun the same command to "
          "resume")
    else:
      eval_metrics = evaluate(state.params, step)
    train_writer.close()
    eval_writer.close()
  return TrainResult(step=step, train_loss=train_loss, eval_metrics=eval_metrics,
                     interrupted=stop.signal_name is not None)
