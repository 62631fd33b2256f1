"""The eval program: a job's checkpoints on its eval sets, one checkpoint or each as it lands.

  --mode=eval --job_log_dir=JOB                       the latest checkpoint
  --mode=eval --job_log_dir=JOB --checkpoint_step=N   step N
  --mode=eval --exp=E --job_log_dir=NEW               before a job has a checkpoint: the
                                                      weights its config starts from
                                                      (train.init_from), as its step 0
  --mode=eval --job_log_dir=JOB --eval_continuous     each checkpoint of a training run beside
                                                      it (this machine or another), as it lands

Only the parameters are restored, into their eval shardings: no optimizer state is read or
allocated. A checkpoint is evaluated only once it is complete and verified (its checksums
match): one still being written, or one that fails verification, is skipped and tried again
at the next poll. Results go under JOB/eval/, never into the training files:
`eval_<set>.jsonl`, `summaries/eval_<set>/`, and `evaluated.json`, the record of which sets
each step was evaluated on. A set's row of a step is written before the record names it, so
a restarted eval evaluates what the record lacks, and first drops rows the record does not
name (a killed run's), leaving one row per step. One eval program per job at a time: it
holds JOB/eval's lock, and leaves the trainer's lock on JOB alone.

Longer than 300 lines with a reason: one checkpoint and `--eval_continuous` share the record of
what was evaluated and the agreement of every process on a step; following a live run (polls,
the trainer's last write, its final step) is the rest.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from etils import epath

from lingvo_lite import memory_fit, outputs, paths
from lingvo_lite.on_mesh import evaluation
from lingvo_lite.checkpoints import selection as checkpoint_selection
from lingvo_lite.checkpoints.manager import Checkpointer
from lingvo_lite.config import files as config_files
from lingvo_lite.errors import UsageError
from lingvo_lite.experiment import Setup
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.programs import (Invocation, ProgramFailure, record_config_where_missing,
                                 refuse_model_changes)
from lingvo_lite.programs.options import checkpoint_step_option, init_from_option, option
from lingvo_lite.runtime import lock as job_lock, summaries
from lingvo_lite.runtime.job_dirs import FILE, FOLDER, JobFiles
from lingvo_lite.weights import sources
from lingvo_lite.weights.job_params import JobParams

RECORD = "evaluated.json"
_STOP, _WAIT = -2, -1  # What process 0 tells the others instead of a step to evaluate.


@dataclasses.dataclass(frozen=True)
class Options:
  """The flags of --mode=eval."""

  checkpoint_step: int | None = checkpoint_step_option()
  init_from: str | None = init_from_option()
  eval_continuous: bool = option(
      False, "--mode=eval: evaluate each checkpoint of a training run beside this one once, "
      "as it lands; exits after the run's final step (train.steps), or after "
      "--eval_timeout_seconds without a new write.")
  eval_timeout_seconds: float = option(
      3600.0, "--eval_continuous: stop when the trainer has written nothing (no checkpoint, "
      "no metrics row) for this long.")
  eval_poll_seconds: float = option(
      10.0, "--eval_continuous: seconds between looks for a new checkpoint.")
  eval_sets: list[str] | None = option(
      None, "--mode=eval: the eval sets to evaluate, by name (comma-separated; default: every "
      "set of eval_data).")

  def config_parts(self, cfg: Any) -> dict[str, Any]:
    """`train.init_from` (and a source's `model`) from --init_from (weights/sources.py): a job
    dir without a checkpoint of its own evaluates the source's parameters."""
    return sources.config_parts(self.init_from, cfg)


# Everything under JOB/eval/ (the training files are only read), and each set's rows there.
JOB_FILES = JobFiles(
    written=(("eval", FOLDER), ("eval/summaries", FOLDER), (f"eval/{RECORD}", FILE),
             (f"eval/{job_lock.LOCK_NAME}", FILE)),
    eval_sets_under="eval/", records_config=True)


def main(invocation: Invocation) -> None:
  """Refuses a model config other than the job's: its parameters (its checkpoints, or a job
  without any: its train.init_from's) would score another model, even where the shapes agree
  (another norm, activation or rotary setting)."""
  options: Options = invocation.options
  refuse_model_changes(invocation, "evaluate")
  _check_options(options)
  setup = selected_sets(invocation.setup, options.eval_sets)
  setup.check_data(train=False)  # Every eval set reads; each has the model's vocabulary.
  # Before anything is restored or allocated: one line instead of an out-of-memory abort.
  memory_fit.check_eval_fits(setup)
  try:
    # A new job dir's config is recorded once the first parameters are read (as decode and
    # export do): a weight source that cannot be read leaves the job dir unmade.
    run(setup, invocation.job_dir, shown_job_dir=invocation.shown_job_dir,
        checkpoint_step=options.checkpoint_step, continuous=options.eval_continuous,
        timeout_seconds=options.eval_timeout_seconds, poll_seconds=options.eval_poll_seconds,
        params_read=lambda: record_config_where_missing(invocation))
  except OSError as e:  # Writing its rows, summaries or evaluated.json (a full disk, say).
    shown = epath.Path(invocation.shown_job_dir or invocation.job_dir) / "eval"
    where = f" ({e.filename})" if e.filename else ""
    raise ProgramFailure(outputs.failed_write(f"the eval results to {shown}{where}", e,
                                              "evaluate again")) from None


def selected_sets(setup: Setup, names: list[str] | None) -> Setup:
  """`setup` with only the eval sets `--eval_sets` names (all of them when it is not given),
  so that only those are read, checked and sized."""
  if not setup.eval_sets:
    raise UsageError("eval_data=None: this config has no eval data; set eval_data or use "
                     "an experiment that defines it")
  if names is None:
    return setup
  valid = f"valid choices: {', '.join(setup.eval_sets)}"
  if not names:
    raise UsageError(f"--eval_sets=: names no eval set; {valid} (or drop the flag for all)")
  unknown = [name for name in names if name not in setup.eval_sets]
  if unknown:
    raise UsageError(f"--eval_sets={','.join(names)}: no eval set named {unknown[0]!r}; {valid}")
  if not isinstance(setup.eval_data, Mapping):
    return setup  # The one set, named "validation".
  return dataclasses.replace(setup, eval_data={
      name: source for name, source in setup.eval_data.items() if name in names})


# Longer than any wait between checkpoints worth polling for (time.sleep refuses inf).
_MAX_POLL_SECONDS = 24 * 3600


def _check_options(options: Options) -> None:
  step = options.checkpoint_step
  checkpoint_selection.check_wanted(step)
  if step is not None and options.eval_continuous:
    raise UsageError(f"--checkpoint_step={step} and --eval_continuous: conflicting flags; "
                     "give one step, or evaluate each checkpoint as it lands")
  for flag, value, most in (("eval_timeout_seconds", options.eval_timeout_seconds, math.inf),
                            ("eval_poll_seconds", options.eval_poll_seconds,
                             _MAX_POLL_SECONDS)):
    if not 0 < value <= most:
      raise UsageError(f"--{flag}={value}: must be a positive number of seconds"
                       + (f", at most {most:g}" if most < math.inf else ""))


class _Record:
  """JOB/eval/evaluated.json: the sets each step was evaluated on (process 0 keeps it).

  Where there is none (a first eval, or one moved away), it is rebuilt from the rows there are:
  a row is written only once its set's pass is complete, so a row is a result to keep.
  """

  def __init__(self, eval_dir: epath.Path, names: list[str]):
    self._path = eval_dir / RECORD
    self.sets: dict[int, list[str]] = {}
    if not self._path.exists():
      for name in names:
        for step in summaries.logged_steps(evaluation.jsonl_path(eval_dir, name)):
          self.sets.setdefault(step, []).append(name)
      self.rebuilt = True
      return
    self.rebuilt = False
    try:
      data = json.loads(self._path.read_text())
      self.sets = {int(step): list(names) for step, names in data["evaluated"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
      raise UsageError(f"{self._path}: not an eval record written by lingvo_lite ({e}); move "
                       "it away, and the next eval rebuilds it from the rows there") from None

  def missing(self, step: int, names: list[str]) -> list[str]:
    return [name for name in names if name not in self.sets.get(step, [])]

  def has(self, step: int, name: str) -> bool:
    return name in self.sets.get(step, [])

  def forget(self, step: int, names: list[str]) -> None:
    """Before `names` are evaluated again at `step`: their rows are to be replaced."""
    kept = [name for name in self.sets.get(step, []) if name not in names]
    if kept:
      self.sets[step] = kept
    else:
      self.sets.pop(step, None)
    self._write()

  def add(self, step: int, names: list[str]) -> None:
    self.sets[step] = sorted(set(self.sets.get(step, [])) | set(names))
    self._write()

  def _write(self) -> None:
    text = json.dumps({"evaluated": {str(s): self.sets[s] for s in sorted(self.sets)}},
                      indent=1)
    paths.write_atomically(self._path, text + "\n")


def run(setup: Setup, job_dir: epath.Path, shown_job_dir: str | None = None,
        checkpoint_step: int | None = None, continuous: bool = False,
        timeout_seconds: float = 3600.0, poll_seconds: float = 10.0,
        params_read: Callable[[], None] | None = None
        ) -> dict[int, dict[str, dict[str, float]]]:
  """Evaluates the eval sets of `setup` on the job's checkpoints (see the module doc).

  Args:
    params_read: Called once, when the first parameters have been read (a checkpoint's, or
      the weights `train.init_from` names), before they are evaluated.

  Returns:
    {step: {set name: metrics}} of the checkpoints this call evaluated.
  """
  sets = list(setup.eval_sets)
  shown = epath.Path(shown_job_dir) if shown_job_dir else job_dir
  is_chief = jax.process_index() == 0
  checkpoint_dir = job_dir / "checkpoints"
  checkpointer, step, source = None, None, None
  # The job's parameters as every program opens them; its processes agree on the step.
  opened = JobParams(setup, job_dir, shown, checkpoint_step, step_chooser=_agreed_step)
  if not continuous:
    choice = opened.choose()
    checkpointer, source = choice.checkpointer, choice.source
    # No checkpoint of its own yet: the weights it starts from, as its step 0.
    step = choice.step if source is None else 0
  eval_dir = job_dir / "eval"
  with job_lock.JobLock(eval_dir, enabled=is_chief, shown=str(shown / "eval"),
                        run_kind="eval"):
    record = _Record(eval_dir, sets)
    if is_chief and not record.rebuilt:  # Rows a killed run wrote and did not record.
      _keep_recorded_rows(eval_dir, sets, record)
    writers = evaluation.SetWriters(eval_dir, sets, enabled=is_chief, resumed_from=None)
    jitted = JittedSteps(setup, opened.mesh)
    evaluated: dict[int, dict[str, dict[str, float]]] = {}

    frozen = None  # A LoRA base or a DPO reference: loaded once, checked against each step.

    def evaluate(checkpointer: Checkpointer, step: int, names: list[str]) -> None:
      nonlocal frozen
      with jitted.activated():
        if jitted.frozen is not None and frozen is None:
          frozen, _ = jitted.frozen.load()
        if source is not None and frozen is not None:
          params = _starting_params(jitted, source, frozen)
        elif source is not None:
          params, _ = opened.load(jitted.mesh_params())
        else:
          if jitted.frozen is not None:
            jitted.frozen.check_resume(checkpointer.metadata(step), step, shown / "checkpoints")
          params = _agreed_restore(jitted, checkpointer, step)
        if params_read is not None and not evaluated:
          params_read()
        results = evaluation.evaluate_sets(jitted, params, {
            name: setup.eval_sets[name] for name in names}, frozen=frozen)
      del params
      again = [name for name in names if record.has(step, name)]
      if is_chief and again:
        # Evaluated again on purpose (--checkpoint_step): its rows are replaced, not added
        # to, once the new ones are in hand; a kill in between leaves the step unrecorded.
        record.forget(step, again)
        _keep_recorded_rows(eval_dir, again, record)
      writers.write(step, results)
      writers.flush()
      if is_chief:
        record.add(step, names)
      evaluated[step] = results
      what = (f"train.init_from {source.describe()} as step {step}" if source is not None
              else f"checkpoint step {step}")
      summaries.log(f"eval of {what} (written to {shown / 'eval'}):\n"
                    + evaluation.table(results), is_chief)

    try:
      if not continuous:
        try:
          evaluate(checkpointer, step, sets)
        except _RestoreFailed as e:
          raise UsageError(str(e)) from None  # The restore's own line names the step.
      else:
        _follow(setup, checkpoint_dir, record, sets, evaluate, timeout_seconds, poll_seconds,
                is_chief)
    finally:
      writers.close()
      if checkpointer is not None:
        checkpointer.close()
  return evaluated


def _starting_params(jitted: JittedSteps, source: Any, frozen: Any) -> Any:
  """A job with frozen parameters and no checkpoint yet, as training would start it (its step
  0): a LoRA job's adapters (a `peft:` source's, else fresh ones, which change nothing), a
  full DPO job's policy (a copy of its reference)."""
  if not jitted.adapters:
    return jax.tree.map(jnp.copy, frozen)
  if source is not None and source.brings_adapters:
    return source.load_adapters(jitted.mesh_params())[0]
  return jitted.init_state().params


def _keep_recorded_rows(eval_dir: epath.Path, names: list[str], record: _Record) -> None:
  for name in names:
    summaries.keep_rows(evaluation.jsonl_path(eval_dir, name),
                        evaluation.summaries_dir(eval_dir, name),
                        lambda step, name=name: record.has(step, name))


class _RestoreFailed(Exception):
  """The checkpoint could not be restored (on this process or another): tried again later."""


def _agreed_restore(jitted: JittedSteps, checkpointer: Checkpointer, step: int) -> Any:
  """The step's parameters, or _RestoreFailed on every process when any process failed (a
  damaged step, or one the trainer's retention deleted mid-restore), so that all go on, or
  none, into the evaluation's collectives."""
  params, problem = None, None
  try:
    params = jitted.restore_params(checkpointer, step)
  except (UsageError, OSError) as e:
    problem = str(e)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    failed = multihost_utils.process_allgather(np.int32(problem is not None))
    if np.any(failed) and problem is None:
      problem = "another process could not restore it"
  if problem is not None:
    raise _RestoreFailed(problem)
  return params


def _agreed_step(checkpointer: Checkpointer | None, checkpoint_dir: epath.Path,
                 wanted: int | None, shown: epath.Path) -> int:
  """Process 0's choice (checkpoints/selection.py), on every process: beside a running
  trainer, two processes listing the folder can see different steps."""
  step, problem = _WAIT, None
  if jax.process_index() == 0:
    try:
      step = checkpoint_selection.chosen_step(checkpointer, checkpoint_dir, wanted, shown)
    except UsageError as e:
      problem = e
  step = _agree([step])[0]
  if problem is not None:
    raise problem
  if step < 0:
    raise UsageError(f"--job_log_dir={shown}: process 0 found no checkpoint to evaluate in "
                     f"{checkpoint_dir} (its own message says why)")
  return step


def _trainer_steps(job_dir: epath.Path, default: int) -> int:
  """`train.steps` of the job's own config.json: the trainer's final step, which a resumed run
  may have raised, and which an eval command's `--exp` need not repeat. `default` where the
  file cannot be read. Read again only when the file changes."""
  path = job_dir / config_files.CONFIG_JSON
  try:
    stat = path.stat()
    return _config_steps(str(path), stat.mtime, stat.length)
  except (OSError, UsageError, AttributeError, TypeError, ValueError):
    return default


@functools.lru_cache(maxsize=4)
def _config_steps(path: str, mtime: float, length: int) -> int:
  del mtime, length  # The cache key: a rewritten file is read again.
  return int(config_files.load(epath.Path(path)).train.steps)


def _last_write(job_dir: epath.Path) -> float:
  """When the trainer last wrote anything eval waits for: a checkpoint folder (orbax's
  temporary ones included) or a metrics row."""
  times = [0.0]
  for path in (job_dir / "checkpoints", job_dir / "metrics.jsonl"):
    try:
      times.append(path.stat().mtime)
      if path.is_dir():
        times += [child.stat().mtime for child in path.iterdir()]
    except OSError:
      continue  # Not there (yet), or deleted between the listing and the stat.
  return max(times)


def _follow(setup: Setup, checkpoint_dir: epath.Path, record: _Record, sets: list[str],
            evaluate, timeout_seconds: float, poll_seconds: float, is_chief: bool) -> None:
  """Evaluates each new checkpoint once, oldest first, until the run's final step is done or
  the trainer has written nothing for `timeout_seconds`. Process 0 decides (the step, and
  which sets it lacks) and every process follows: a multi-process eval restores and
  evaluates together."""
  job_dir = checkpoint_dir.parent
  final_step = _trainer_steps(job_dir, setup.train.steps)
  retry_seconds = max(10 * poll_seconds, 30.0)
  checkpointer = None
  warned: set[tuple[int, str]] = set()
  seen: set[int] = set()
  failed: dict[int, float] = {}  # Step -> when its restore last failed.
  started = time.time()
  last_evaluation = started
  summaries.log(f"waiting for checkpoints in {checkpoint_dir} (until step {final_step}, or "
                f"{timeout_seconds:g} s without a new one)", is_chief)
  try:
    while True:
      # Every process opens and re-reads the checkpoint manager at the same point: orbax
      # synchronizes the processes in those calls.
      if checkpointer is None and _agree([int(checkpoint_dir.exists())])[0]:
        checkpointer = checkpoint_selection.open_existing(checkpoint_dir, setup.checkpoint)
      choice, wanted = _WAIT, [0] * len(sets)
      if checkpointer is not None:
        try:
          checkpointer.refresh()
          if is_chief:
            final_step = _trainer_steps(job_dir, final_step)
            now = time.time()
            retry = {step for step, when in failed.items() if now - when < retry_seconds}
            choice = _next_step(checkpointer, record, sets, seen, warned, final_step, retry)
        except OSError as e:  # The trainer deleted a step while it was listed.
          logging.warning("listing %s failed (%s); looking again", checkpoint_dir, e)
        if choice >= 0:  # The sets this step lacks.
          wanted = [int(not record.has(choice, name)) for name in sets]
      choice, *wanted = _agree([choice, *wanted])
      if choice == _STOP:
        summaries.log(f"evaluated the final step {final_step}; done", is_chief)
        return
      if choice >= 0:
        try:
          evaluate(checkpointer, choice, [name for name, want in zip(sets, wanted) if want])
          failed.pop(choice, None)
          last_evaluation = time.time()
        except _RestoreFailed as e:
          # Damaged, or deleted by the trainer's retention mid-restore: newer steps go first,
          # this one is tried again after `retry_seconds`.
          failed[choice] = time.time()
          if (choice, str(e)) not in warned:
            warned.add((choice, str(e)))
            logging.warning("skipping checkpoint step %d for now: %s", choice, e)
        continue
      quiet = time.time() - max(_last_write(job_dir), last_evaluation, started)
      if _agree([int(quiet > timeout_seconds)])[0]:
        done = [s for s in record.sets if not record.missing(s, sets)]
        summaries.log(f"stopping: the trainer wrote nothing in {job_dir} for "
                      f"{timeout_seconds:g} s (--eval_timeout_seconds) and its final step "
                      f"{final_step} was not evaluated; last evaluated step: "
                      f"{max(done) if done else 'none'}", is_chief)
        return
      time.sleep(poll_seconds)
  finally:
    if checkpointer is not None:
      checkpointer.close()


def _next_step(checkpointer: Checkpointer, record: _Record, sets: list[str], seen: set[int],
               warned: set[tuple[int, str]], final_step: int, retry_later: set[int]) -> int:
  """The oldest usable step not yet evaluated on every set (and not in `retry_later`); _STOP
  once the final step is, _WAIT when nothing is due. Steps still being written or not yet
  verified are not usable (orbax keeps a step out of sight until it is whole; its checksums
  follow at the trainer's next step)."""
  skipped = checkpointer.skipped_steps()
  usable = [s for s in checkpointer.all_steps() if s not in skipped]
  for step in sorted(seen - set(usable)):
    if record.missing(step, sets) and (step, "gone") not in warned:
      warned.add((step, "gone"))
      logging.warning("checkpoint step %d was deleted before it was evaluated (the trainer's "
                      "checkpoint.max_to_keep); evaluating the ones that remain", step)
  seen.update(usable)
  for step in usable:
    if record.missing(step, sets) and step not in retry_later:
      return step
  if any(step >= final_step and not record.missing(step, sets) for step in record.sets):
    return _STOP
  return _WAIT


def _agree(values: list[int]) -> list[int]:
  """Process 0's `values` (steps, flags), on every process."""
  if jax.process_count() == 1:
    return list(values)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return [int(v) for v in multihost_utils.broadcast_one_to_all(np.asarray(values, np.int32))]
