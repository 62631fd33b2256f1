"""The eval program: evaluate the latest checkpoint of a job on its eval data.

Writes to JOB/eval/ (metrics.jsonl and TensorBoard summaries), never to the training files.
"""

from __future__ import annotations

import jax
from etils import epath

from lingvo_lite import memory_fit, summaries
from lingvo_lite.checkpoints import Checkpointer
from lingvo_lite.errors import UsageError
from lingvo_lite.experiment import Setup
from lingvo_lite.programs import Invocation, summarize_changes
from lingvo_lite.programs.jitted import JittedSteps


def main(invocation: Invocation) -> None:
  """Refuses a model config other than the job's: its checkpoints would score another model,
  even where the shapes agree (another norm, activation or rotary setting)."""
  changes = [c for c in invocation.config_changes() if c.startswith("model.")]
  if changes:
    raise UsageError(f"--job_log_dir={invocation.shown_job_dir}: the model config differs "
                     f"from the one its checkpoints were trained with "
                     f"({summarize_changes(changes)}); evaluate "
                     "with the job's own config (drop the --exp and model overrides)")
  invocation.setup.check_data(("eval_data",))
  run(invocation.setup, invocation.job_dir)


def run(setup: Setup, job_dir: epath.Path) -> dict[str, float]:
  if setup.eval_data is None:
    raise UsageError("eval_data=None: this config has no eval data; set eval_data or use "
                     "an experiment that defines it")
  # Before anything is restored or allocated: one line instead of an out-of-memory abort.
  memory_fit.check_eval_fits(setup)
  checkpoint_dir = job_dir / "checkpoints"
  checkpointer = Checkpointer(checkpoint_dir, setup.checkpoint, create=False) \
      if checkpoint_dir.exists() else None
  step = checkpointer.latest_step() if checkpointer else None
  if step is None:
    skipped = checkpointer.skipped_steps() if checkpointer else {}
    if skipped:
      # "No checkpoint; train first" would mislead: there are steps, and none is usable.
      raise UsageError(f"--job_log_dir={job_dir}: no usable checkpoint in {checkpoint_dir}: "
                       f"{'; '.join(skipped.values())}; fix the step folder or move it away, "
                       "or train again (--mode=train deletes unusable steps and starts over)")
    raise UsageError(f"--job_log_dir={job_dir}: no checkpoint in {checkpoint_dir}; "
                     "train first (--mode=train)")
  is_chief = jax.process_index() == 0
  jitted = JittedSteps(setup)
  with jitted.activated():
    state = jitted.restore_state(checkpointer, step)
    metrics = jitted.evaluate(state.params, setup.eval_data)
  writer = summaries.MetricsWriter(job_dir / "eval" / "metrics.jsonl",
                                   job_dir / "eval" / "summaries", enabled=is_chief)
  writer.write(step, metrics)
  writer.close()
  checkpointer.close()
  summaries.log(f"eval of checkpoint step {step}: loss {metrics['loss']:.4f}  bits/token "
                f"{metrics['bits_per_token']:.4f}  "
                + (f"bits/byte {metrics['bits_per_byte']:.4f}  " if "bits_per_byte" in metrics
                   else "") + f"accuracy {metrics['accuracy']:.4f}  "
                f"(written to {job_dir / 'eval'})", is_chief)
  return {"step": step, **metrics}
