"""What a training run writes into its job dir besides checkpoints, kept only once a
checkpoint covers it."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Sequence

import jax
from absl import logging
from etils import epath

from lingvo_lite.config import files as config_files
from lingvo_lite.on_mesh import evaluation
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.programs.train.failures import OutputWriteError
from lingvo_lite.runtime import hangup, run_info, summaries


@contextlib.contextmanager
def writing_outputs() -> Iterator[None]:
  try:
    yield
  except OSError as e:
    reason = " ".join((e.strerror or str(e) or type(e).__name__).split())
    code = f" (errno {e.errno})" if e.errno else ""
    raise OutputWriteError(f"writing {e.filename or 'the job dir'} failed: {reason}{code}",
                           e.errno) from e


class RunOutputs:
  """What a run writes into its job dir besides checkpoints: the config, the metrics, the
  run's identity (a row of `run_info.jsonl`) and the lines of the job's log (`note`).

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
               jitted: JittedSteps, command_line: Sequence[str] | None,
               initialized_from: str | None = None):
    self._record_config = record_config
    self._job_dir, self._enabled = job_dir, enabled
    # A new job's config is written below, an existing job's at the first commit.
    self._config_recorded = job_is_new
    resumed_from = None if job_is_new else start
    with writing_outputs():
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
            command_line, initialized_from))

  def write_train(self, step: int, values: dict[str, float]) -> None:
    with writing_outputs():
      self.train.write(step, values)

  def write_eval(self, step: int, results: dict[str, dict[str, float]]) -> None:
    with writing_outputs():
      self.eval.write(step, results)

  def note(self, line: str) -> None:
    """Appends `line` to the job's log (JOB/train.log): how a run stopped, for a user whose
    terminal is gone (runtime/hangup.py). Raises nothing."""
    if self._enabled:
      hangup.record(self._job_dir, line)

  def commit(self, step: int) -> None:
    """The rows up to `step` are kept from now on; then what the first commit rewrites."""
    self.run_info.commit()
    # Kept first, written after: a failed write below takes none of these rows back.
    with writing_outputs():
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
    with writing_outputs():
      try:
        self.train.close()
      finally:
        self.eval.close()
