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

The package, one concern a module: this one is the program (its flags, its checks, which sets);
evaluator.py a run (the lock, the record, a step's evaluation); record.py JOB/eval/evaluated.json;
follow.py `--eval_continuous`; agreement.py what the processes of a multi-process eval agree on.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from etils import epath

from lingvo_lite import memory_fit, outputs
from lingvo_lite.checkpoints import selection as checkpoint_selection
from lingvo_lite.errors import UsageError
from lingvo_lite.experiment import Setup
from lingvo_lite.programs import (Invocation, ProgramFailure, record_config_where_missing,
                                 refuse_model_changes)
from lingvo_lite.programs.eval import follow
from lingvo_lite.programs.eval.evaluator import run
from lingvo_lite.programs.eval.record import RECORD
from lingvo_lite.programs.options import checkpoint_step_option, init_from_option, option
from lingvo_lite.runtime import lock as job_lock
from lingvo_lite.runtime.job_dirs import FILE, FOLDER, JobFiles
from lingvo_lite.weights import sources

__all__ = ["JOB_FILES", "Options", "RECORD", "main", "run", "selected_sets"]


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


def _check_options(options: Options) -> None:
  step = options.checkpoint_step
  checkpoint_selection.check_wanted(step)
  if step is not None and options.eval_continuous:
    raise UsageError(f"--checkpoint_step={step} and --eval_continuous: conflicting flags; "
                     "give one step, or evaluate each checkpoint as it lands")
  for flag, value, most in (("eval_timeout_seconds", options.eval_timeout_seconds, math.inf),
                            ("eval_poll_seconds", options.eval_poll_seconds,
                             follow.MAX_POLL_SECONDS)):
    if not 0 < value <= most:
      raise UsageError(f"--{flag}={value}: must be a positive number of seconds"
                       + (f", at most {most:g}" if most < math.inf else ""))
