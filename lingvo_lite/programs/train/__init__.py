"""The train program: init or resume, then step, log, evaluate and checkpoint until done.

This module is the program (its options, the files it writes, `main`, `run`: the start-up
and the failure paths); `loop.py` runs the steps, `run_outputs.py` keeps what the run writes
besides checkpoints, and `failures.py` says how a run stops.

Resume is exact: the state comes back from the latest checkpoint and the data source
yields the batch of a step as a function of (seed, step), so a stopped-and-resumed run
computes the same losses as an uninterrupted one. SIGTERM, SIGINT or SIGHUP saves and stops
cleanly (exit code 0), and says so in the job's log too (JOB/train.log); rerunning the same
command continues.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
from etils import epath

from lingvo_lite import memory_fit, mfu
from lingvo_lite.checkpoints import health as checkpoint_health
from lingvo_lite.checkpoints import selection as checkpoint_selection
from lingvo_lite.checkpoints.orbax_errors import CheckpointWriteError
from lingvo_lite.checkpoints.manager import Checkpointer
from lingvo_lite.config import files as config_files
from lingvo_lite.errors import UsageError
from lingvo_lite.experiment import Setup
from lingvo_lite.on_mesh import evaluation
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.programs import Invocation, recorded_config, summarize_changes
from lingvo_lite.programs.options import init_from_option, option
from lingvo_lite.programs.train.failures import (NonFinite, OutputWriteError, TrainingFailure,
                                                 newest_checkpoint, resume_advice, write_advice)
from lingvo_lite.programs.train.loop import PROFILE_DIR, TrainLoop, TrainResult
from lingvo_lite.programs.train.run_outputs import RunOutputs
from lingvo_lite.runtime import hangup, lock as job_lock, run_info, summaries
from lingvo_lite.runtime.job_dirs import FILE, FOLDER, JobFiles
from lingvo_lite.runtime.stop_request import StopRequest
from lingvo_lite.runtime.watchdog import Watchdog
from lingvo_lite.weights import sources
from lingvo_lite.weights.job_checkpoint import FIELD

# What callers of the program (tests, benchmarks) use besides main and run.
__all__ = ["JOB_FILES", "Options", "PROFILE_DIR", "TrainResult", "TrainingFailure", "main", "run"]


@dataclasses.dataclass(frozen=True)
class Options:
  """The flags of --mode=train."""

  compiled_step_in: str | None = option(
      None, "--mode=train: run the compiled step saved at this folder instead of compiling; "
      "refused (one line) if anything it was compiled for differs. A saved step is code: load "
      "only your own.")
  init_from: str | None = init_from_option()

  def config_parts(self, cfg: Any) -> dict[str, Any]:
    """The config parts these options set (the executor sets them before the fiddlers and
    --fdl overrides): `train.init_from` from --init_from, and the source's `model` where it
    describes one (weights/sources.py)."""
    return sources.config_parts(self.init_from, cfg)


# The job dir, created where missing: config, checkpoints, metrics and run info, TensorBoard
# summaries, stack dumps, the job's lock and log, each eval set's rows; a profiler trace if
# asked for.
JOB_FILES = JobFiles(
    creates=True,
    written=(("checkpoints", FOLDER), ("summaries", FOLDER), (PROFILE_DIR, FOLDER),
             (config_files.CONFIG_JSON, FILE), (config_files.CONFIG_TXT, FILE),
             ("metrics.jsonl", FILE), (run_info.FILE_NAME, FILE), ("stacks", FOLDER),
             (job_lock.LOCK_NAME, FILE), (hangup.LOG_NAME, FILE)),
    eval_sets_under="",
    when_profiling=((f"{PROFILE_DIR}/plugins", FOLDER),
                    (f"{PROFILE_DIR}/plugins/profile", FOLDER)))


def main(invocation: Invocation) -> None:
  """The train program: under the job's lock, checks the job's config, trains, summarizes."""
  setup, job_dir = invocation.setup, invocation.job_dir
  is_chief = jax.process_index() == 0
  setup.check_data()  # An empty data source is one line now, not a failure mid-run.
  # The lock first: what the job holds (its config, its checkpoints) is read under it.
  lock = job_lock.JobLock(job_dir, enabled=is_chief, shown=invocation.shown_job_dir)
  # A hang-up stops the run as SIGTERM does; its terminal is gone then, and writing to it
  # must not fail the save, nor the summary after it.
  with hangup.surviving_hangups(), lock:
    changes = invocation.config_changes()
    if changes:
      raise UsageError(
          f"--job_log_dir={invocation.shown_job_dir}: the config differs from "
          f"{recorded_config(invocation)} ({summarize_changes(changes)}); train with the "
          "job's own config or use a new --job_log_dir")
    job_is_new = not (job_dir / "config.json").exists()
    record_config = invocation.write_config if is_chief else lambda: None
    result = run(setup, job_dir, record_config, job_is_new,
                 compiled_step_in=invocation.options.compiled_step_in,
                 command_line=invocation.command_line, cache_folder=invocation.cache_folder)
    if is_chief:
      print(_summary(result, setup.eval_sets, epath.Path(invocation.shown_job_dir)),
            flush=True)


def _summary(result: TrainResult, eval_sets: Iterable[str], shown: epath.Path) -> str:
  """The lines a finished run ends with: where it stopped, its final losses, and where its
  files are (the eval sets' by name), under the job dir as the user wrote it (`shown`)."""
  lines = [f"done: step {result.step}" + (" (stopped by signal)" if result.interrupted else "")]
  if result.train_loss is not None:
    lines.append(f"  final train loss: {result.train_loss:.4f}")
  for name in result.eval_results or {}:
    label = "final eval loss: " if len(result.eval_results) == 1 else f"final eval loss ({name}):"
    lines.append(f"  {label} {result.eval_results.final_summary(name)}")
  eval_files = ", ".join(str(evaluation.jsonl_path(shown, name)) for name in eval_sets)
  lines += [f"  config:      {shown / 'config.txt'} (reload: "
            f"--fdl_config_file={shown / 'config.json'})",
            f"  checkpoints: {shown / 'checkpoints'}",
            f"  metrics:     {shown / 'metrics.jsonl'}" + (f", {eval_files}" if eval_files
                                                         else ""),
            f"  TensorBoard: tensorboard --logdir={shown / 'summaries'}"]
  return "\n".join(lines)


def run(setup: Setup, job_dir: epath.Path,
        record_config: Callable[[], None] = lambda: None,
        job_is_new: bool = True, compiled_step_in: str | None = None,
        command_line: Sequence[str] | None = None, cache_folder: str | None = None
        ) -> TrainResult:
  """Trains `setup` in `job_dir`, resuming from its latest verified checkpoint if any.

  Nothing in an existing `job_dir` changes until the starting state is in hand (initialized,
  or restored and verified), and what the run writes after that stays only if it saves a
  checkpoint (see `RunOutputs`).

  Args:
    compiled_step_in: A folder written by `--mode=compile --compiled_step_out`: its step
      replaces the jitted one once its manifest matches this setup and host.
    command_line: The command line the run's row of run_info.jsonl records (the executor's
      Invocation.command_line); None records sys.argv.
    cache_folder: The run's compilation cache folder, which also keeps a CPU host's
      measured matmul peak (mfu.host_matmul_peak); None measures it.

  Raises:
    TrainingFailure: a non-finite loss or state, or a failed save (one-line message).
    UsageError: the saved step was compiled for something else.
  """
  is_chief = jax.process_index() == 0
  jitted = _jitted_steps(setup, compiled_step_in)
  # Before anything is made in the job dir: a source that cannot be read leaves it as it was.
  frozen = _frozen(jitted)
  warm_start = _warm_start(jitted, job_dir)
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
      initialized_from = warm_start[1] if start is None and warm_start is not None else None
      state, start = _restore_or_init(jitted, checkpointer, start, job_dir, say, warm_start,
                                      frozen)
      checkpointer.clean_up_for_training(start)
      outputs, health = _run_files(jitted, checkpointer, job_dir, start, job_is_new,
                                   record_config, command_line, initialized_from)
    try:
      throughput = _start_meter(setup, jitted, state, start, watchdog, say, cache_folder)
      loop = TrainLoop(setup=setup, jitted=jitted, checkpointer=checkpointer, outputs=outputs,
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


def _jitted_steps(setup: Setup, compiled_step_in: str | None) -> JittedSteps:
  """The jitted steps, checked to fit before anything is allocated or written; the train step
  a `--mode=compile --compiled_step_out` folder holds where one is given."""
  # A LoRA job's base is frozen: it may be held in int8 (QLoRA).
  setup.model.check_quantization("model", training=setup.train.lora is None)
  memory_fit.check_fits(setup)  # Before anything is allocated or written.
  jitted = JittedSteps(setup)
  if compiled_step_in is not None:
    from lingvo_lite.programs.compile import compiled_steps  # pylint: disable=g-import-not-at-top
    jitted.train_step = compiled_steps.load(compiled_step_in, jitted)
  return jitted


def _run_files(jitted: JittedSteps, checkpointer: Checkpointer, job_dir: epath.Path, start: int,
               job_is_new: bool, record_config: Callable[[], None],
               command_line: Sequence[str] | None, initialized_from: str | None
               ) -> tuple[RunOutputs, checkpoint_health.TrainingHealth]:
  """What the run writes besides checkpoints (run_outputs.py), from `start`, and the health of
  the steps saved so far, read from the rows of the verified checkpoints; both tied to the
  checkpoints as they are verified."""
  is_chief = jax.process_index() == 0
  try:
    outputs = RunOutputs(job_dir, start, job_is_new, record_config, enabled=is_chief,
                         eval_sets=list(jitted.setup.eval_sets), jitted=jitted,
                         command_line=command_line, initialized_from=initialized_from)
  except OutputWriteError as e:
    raise TrainingFailure(f"{e}; {write_advice(e.errno)}") from e
  health = checkpoint_health.TrainingHealth(
      summaries.read_rows(job_dir / "metrics.jsonl", lambda step: step <= start)
      if is_chief and not job_is_new else ())
  # The outputs a checkpoint covers are kept the moment it is verified, on every path; and
  # retention keeps the step a diverged run would be told to resume from.
  checkpointer.on_verified = outputs.commit
  checkpointer.also_keep = health.newest_healthy
  return outputs, health


def _frozen(jitted: JittedSteps) -> tuple[Any, str] | None:
  """(the frozen parameters a step reads, what they are): a LoRA job's base or the reference
  of a job whose objective needs one (weights/frozen_weights.py), loaded on every start; None
  for a job without."""
  if jitted.frozen is None:
    return None
  with jitted.activated():
    return jitted.frozen.load()


def _warm_start(jitted: JittedSteps, job_dir: epath.Path) -> tuple[Any, str] | None:
  """(`train.init_from`'s parameters, what they are) where the job has no usable checkpoint
  of its own to resume from; else None (no source, or the job resumes). A job with frozen
  weights starts from them instead (`_restore_or_init`), a LoRA job's adapters from the
  source's where it has some (a `peft:` source)."""
  source = jitted.setup.train.init_from
  if source is None:
    return None
  own = checkpoint_selection.open_existing(job_dir / "checkpoints", jitted.setup.checkpoint)
  if own is not None and own.latest_step(warn=False) is not None:
    return None
  with jitted.activated():
    if jitted.adapters:
      return source.load_adapters(jitted.mesh_params()) if source.brings_adapters else None
    if jitted.frozen is not None:
      return None
    return source.load(jitted)


def _restore_or_init(jitted: JittedSteps, checkpointer: Checkpointer, start: int | None,
                     job_dir: epath.Path, say: Callable[[str], None],
                     warm_start: tuple[Any, str] | None,
                     frozen: tuple[Any, str] | None = None) -> tuple[Any, int]:
  """The state to start from and its step, in the order weights/job_checkpoint.py documents:
  the job's own checkpoint `start` restored (and verified); else a new state at step 0 with
  the `warm_start` parameters (`train.init_from`'s, loaded already) and a fresh optimizer;
  else a new state. `frozen` (loaded already) joins the state: a LoRA job's fresh adapters
  start at zero update over it, a full fine-tune's parameters (whose objective needs a
  reference) as a copy of it."""
  frozen_tree, frozen_what = frozen if frozen is not None else (None, "")
  if start is None:
    if warm_start is not None:
      params, loaded = warm_start
      state = jitted.state_with_params(params, frozen_tree)
      say(f"initialized a new state in {job_dir} with the "
          f"{'adapters' if jitted.adapters else 'parameters'} of {loaded} ({FIELD}); the "
          "optimizer starts fresh")
      return state, 0
    if frozen is not None and not jitted.adapters:  # The policy starts as its reference.
      state = jitted.state_with_params(jax.tree.map(jnp.copy, frozen_tree), frozen_tree)
      say(f"initialized a new state in {job_dir} with the parameters of {frozen_what} "
          f"({FIELD}), and a frozen copy of them as the reference of train.objective "
          f"({type(jitted.objective).__name__})")
      return state, 0
    state = jitted.init_state(frozen_tree)
    say(f"initialized a new state in {job_dir}" + (
        f": new LoRA adapters over {frozen_what}" if jitted.adapters else ""))
    return state, 0
  if jitted.frozen is not None:
    jitted.frozen.check_resume(checkpointer.metadata(start), start, job_dir / "checkpoints")
  state = jitted.restore_state(checkpointer, start).replace(frozen=frozen_tree)
  say(f"resumed from step {start} in {job_dir / 'checkpoints'}")
  return state, start


def _failure_after_start(error: TrainingFailure | CheckpointWriteError,
                         checkpointer: Checkpointer, outputs: RunOutputs,
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
    message += (f"; training stopped, and {newest_checkpoint(checkpointer)}: "
                f"{write_advice(error.errno)}")
  elif isinstance(error, NonFinite):
    health.add_failure(error.step)
    message += f"; {resume_advice(checkpointer, health, job_dir / 'checkpoints')}"
  return TrainingFailure(message)


def _start_meter(setup: Setup, jitted: JittedSteps, state, start: int, watchdog: Watchdog,
                 say: Callable[[str], None], cache_folder: str | None
                 ) -> summaries.Throughput:
  """Says the model's size and the batch's layout, then starts the throughput meter: its
  clock starts here, so the compile that follows is counted, off the steps."""
  data, num_devices = setup.train_data, jitted.target.num_devices
  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  trained = ""
  if jitted.adapters:  # The adapters are trained, the model's own parameters frozen.
    trained = f" (LoRA: {num_params / 1e6:.3g}M trained, the rest frozen)"
    num_params = setup.model.num_parameters() + num_params
  mesh_shape = " ".join(f"{axis}={size}" for axis, size in jitted.mesh.shape.items())
  # The rows the step trains on: the data's, or those an objective makes of them (GRPO's
  # G completions per prompt).
  (rows, length), _ = jitted.train_batch_spec().get(
      "inputs", ((data.global_batch_size, data.sequence_length), "int32"))
  flops = mfu.model_flops_per_step(setup.model, rows, length)
  with watchdog.excused("measuring the peak"):  # On a CPU: a compile and 11 big matmuls.
    peak, peak_source = mfu.peak_flops_per_device(jitted.target.devices[0],
                                                  setup.train.peak_tflops_per_device,
                                                  cache_folder)
  say(f"model: {num_params / 1e6:.2f}M parameters{trained}, {flops / 1e12:.3g} TFLOP per step; "
      f"peak {peak / 1e12:.3g} TFLOP/s per device ({peak_source})")
  say(f"blocks: attention {setup.model.attention_choice()}, remat "
      f"{setup.model.remat_policy}")
  say(f"batch: global {rows} x {length} tokens = {rows / num_devices:g} per device x "
      f"{num_devices} devices; mesh {mesh_shape}; {jax.process_count()} process(es)")
  tokens_per_step = rows * length
  return summaries.Throughput(start, setup.train.steps, tokens_per_step, flops, num_devices,
                              peak, _peak_raiser(peak_source, cache_folder, say))


def _peak_raiser(source: str, cache_folder: str | None,
                 say: Callable[[str], None]) -> Callable[[float], None]:
  """What the meter calls when steps beat the peak (a host measured while busy): the raised
  peak is kept (mfu.raised_peak), and said once."""
  said = []

  def raise_peak(flops: float) -> None:
    raised = mfu.raised_peak(flops, source, cache_folder)
    if not said:
      said.append(True)
      say(f"peak raised to {flops / 1e12:.3g} TFLOP/s per device ({raised}); MFU is against "
          "it from here")
  return raise_peak
