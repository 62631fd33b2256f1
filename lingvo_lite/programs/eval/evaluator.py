"""One eval run over a job's checkpoints: the lock on JOB/eval, the record, and a step's
evaluation (its parameters read, its sets evaluated, their rows written, the record updated),
for one checkpoint or each as it lands (follow.py)."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from etils import epath

from lingvo_lite.checkpoints.manager import Checkpointer
from lingvo_lite.errors import UsageError
from lingvo_lite.experiment import Setup
from lingvo_lite.programs.eval import agreement, follow
from lingvo_lite.programs.eval.record import EvalRecord
from lingvo_lite.runtime import lock as job_lock, summaries
from lingvo_lite.on_mesh import evaluation
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.weights.job_params import JobParams

Results = dict[int, dict[str, dict[str, float]]]  # {step: {set name: metrics}}


def run(setup: Setup, job_dir: epath.Path, shown_job_dir: str | None = None,
        checkpoint_step: int | None = None, continuous: bool = False,
        timeout_seconds: float = 3600.0, poll_seconds: float = 10.0,
        params_read: Callable[[], None] | None = None) -> Results:
  """Evaluates the eval sets of `setup` on the job's checkpoints (see the package doc).

  Args:
    params_read: Called once, when the first parameters have been read (a checkpoint's, or
      the weights `train.init_from` names), before they are evaluated.

  Returns:
    {step: {set name: metrics}} of the checkpoints this call evaluated.
  """
  sets = list(setup.eval_sets)
  shown = epath.Path(shown_job_dir) if shown_job_dir else job_dir
  is_chief = jax.process_index() == 0
  checkpointer, step, source = None, None, None
  # The job's parameters as every program opens them; its processes agree on the step.
  opened = JobParams(setup, job_dir, shown, checkpoint_step, step_chooser=agreement.agreed_step)
  if not continuous:
    choice = opened.choose()
    checkpointer, source = choice.checkpointer, choice.source
    # No checkpoint of its own yet: the weights it starts from, as its step 0.
    step = choice.step if source is None else 0
  eval_dir = job_dir / "eval"
  with job_lock.JobLock(eval_dir, enabled=is_chief, shown=str(shown / "eval"),
                        run_kind="eval"):
    record = EvalRecord(eval_dir, sets)
    if is_chief and not record.rebuilt:  # Rows a killed run wrote and did not record.
      record.keep_recorded_rows(sets)
    writers = evaluation.SetWriters(eval_dir, sets, enabled=is_chief, resumed_from=None)
    evaluate = StepEvaluator(opened, source, record, writers, shown, params_read)
    try:
      if not continuous:
        try:
          evaluate(checkpointer, step, sets)
        except agreement.RestoreFailed as e:
          raise UsageError(str(e)) from None  # The restore's own line names the step.
      else:
        follow.follow(setup, job_dir / "checkpoints", record, sets, evaluate, timeout_seconds,
                      poll_seconds, is_chief)
    finally:
      writers.close()
      if checkpointer is not None:
        checkpointer.close()
  return evaluate.evaluated


class StepEvaluator:
  """Evaluates sets of one step at a time: `evaluate(checkpointer, step, names)`.

  Attributes:
    evaluated: {step: {set name: metrics}} of what it evaluated.
  """

  def __init__(self, opened: JobParams, source: Any, record: EvalRecord,
               writers: evaluation.SetWriters, shown: epath.Path,
               params_read: Callable[[], None] | None):
    self.opened, self.source, self.record, self.writers = opened, source, record, writers
    self.shown, self.params_read = shown, params_read
    self.setup = opened.setup
    self.is_chief = jax.process_index() == 0
    self.jitted = JittedSteps(self.setup, opened.mesh)
    self.frozen = None  # A LoRA base or a DPO reference: loaded once, checked at each step.
    self.evaluated: Results = {}

  def __call__(self, checkpointer: Checkpointer, step: int, names: list[str]) -> None:
    """Evaluates `names` at `step` and writes their rows; agreement.RestoreFailed where the
    step's parameters cannot be read (on any process)."""
    with self.jitted.activated():
      params = self._params(checkpointer, step)
      if self.params_read is not None and not self.evaluated:
        self.params_read()
      results = evaluation.evaluate_sets(self.jitted, params, {
          name: self.setup.eval_sets[name] for name in names}, frozen=self.frozen)
    del params
    self._write(step, names, results)
    what = (f"train.init_from {self.source.describe()} as step {step}"
            if self.source is not None else f"checkpoint step {step}")
    summaries.log(f"eval of {what} (written to {self.shown / 'eval'}):\n"
                  + evaluation.table(results), self.is_chief)

  def _params(self, checkpointer: Checkpointer, step: int) -> Any:
    """The parameters evaluated at `step`: the checkpoint's, or (a job without one) those
    its `train.init_from` starts it from."""
    jitted, source = self.jitted, self.source
    if jitted.frozen is not None and self.frozen is None:
      self.frozen, _ = jitted.frozen.load()
    if source is not None and self.frozen is not None:
      return _starting_params(jitted, source, self.frozen)
    if source is not None:
      return self.opened.load(jitted.mesh_params())[0]
    if jitted.frozen is not None:
      jitted.frozen.check_resume(checkpointer.metadata(step), step, self.shown / "checkpoints")
    return agreement.agreed_restore(jitted, checkpointer, step)

  def _write(self, step: int, names: list[str], results: dict[str, dict[str, float]]) -> None:
    """The rows of `names` at `step`, and the record naming them."""
    record = self.record
    again = [name for name in names if record.has(step, name)]
    if self.is_chief and again:
      # Evaluated again on purpose (--checkpoint_step): its rows are replaced, not added
      # to, once the new ones are in hand; a kill in between leaves the step unrecorded.
      record.forget(step, again)
      record.keep_recorded_rows(again)
    self.writers.write(step, results)
    self.writers.flush()
    if self.is_chief:
      record.add(step, names)
    self.evaluated[step] = results


def _starting_params(jitted: JittedSteps, source: Any, frozen: Any) -> Any:
  """A job with frozen parameters and no checkpoint yet, as training would start it (its step
  0): a LoRA job's adapters (a `peft:` source's, else fresh ones, which change nothing), a
  full DPO job's policy (a copy of its reference)."""
  if not jitted.adapters:
    return jax.tree.map(jnp.copy, frozen)
  if source is not None and source.brings_adapters:
    return source.load_adapters(jitted.mesh_params())[0]
  return jitted.init_state().params
