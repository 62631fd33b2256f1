"""Choosing which checkpoint step of a job a reading program uses (eval, decode).

A program that reads a job's checkpoints is given a step (`--checkpoint_step=N`) or takes the
latest one. Either way the choice is refused in one line when it cannot be used: no
checkpoint folder yet, a step that is not there, one that was set aside as unusable (its
checksums missing or wrong), or a folder whose every step is unusable. The choice lives here,
beside the checkpoints, so that every reading program makes it the same way and none imports
another to get it.
"""

from __future__ import annotations

from etils import epath

from lingvo_lite.checkpoints.manager import CheckpointSettings, Checkpointer
from lingvo_lite.errors import UsageError


def check_wanted(step: int | None) -> None:
  """A `--checkpoint_step` that can name no step is refused before anything is read."""
  if step is not None and step < 0:
    raise UsageError(f"--checkpoint_step={step}: must be a step number >= 0")


def open_existing(checkpoint_dir: epath.Path,
                  settings: CheckpointSettings) -> Checkpointer | None:
  """A reader of the job's checkpoints, or None where the folder is not there: a reading
  program never creates it (training does)."""
  return Checkpointer(checkpoint_dir, settings, create=False) if checkpoint_dir.exists() \
      else None


def chosen_step(checkpointer: Checkpointer | None, checkpoint_dir: epath.Path,
                wanted: int | None, shown: epath.Path, step_name: str = "--checkpoint_step",
                job_name: str = "--job_log_dir") -> int:
  """`wanted` if it is a usable step, else the latest one; one line when there is none.

  Args:
    checkpointer: The job's checkpoints (None: the folder is not there, `open_existing`).
    checkpoint_dir: Their folder, for messages.
    wanted: `--checkpoint_step`'s value (None: the latest usable step).
    shown: The job dir as the user wrote it, for messages.
    step_name, job_name: What the user set the step and the job with (a flag, or a config
      field such as train.init_from.step), for messages.

  Raises:
    UsageError: the step cannot be used, or there is none; the line says why and what to do.
  """
  if checkpointer is None:
    raise UsageError(f"{job_name}={shown}: no checkpoint in {checkpoint_dir}; "
                     "train first (--mode=train)")
  skipped = checkpointer.skipped_steps()
  if wanted is not None:
    usable = [s for s in checkpointer.all_steps() if s not in skipped]
    if wanted in skipped:
      raise UsageError(f"{step_name}={wanted}: checkpoint {skipped[wanted]}")
    if wanted not in usable:
      choices = ", ".join(map(str, usable)) if usable else "none"
      raise UsageError(f"{step_name}={wanted}: no such checkpoint in {checkpoint_dir}; "
                       f"its steps: {choices}")
    return wanted
  step = checkpointer.latest_step()
  if step is None:
    if skipped:
      # "No checkpoint; train first" would mislead: there are steps, and none is usable.
      raise UsageError(f"{job_name}={shown}: no usable checkpoint in {checkpoint_dir}: "
                       f"{'; '.join(skipped.values())}; fix the step folder or move it away, "
                       "or train again (--mode=train moves unusable steps aside and starts over)")
    raise UsageError(f"{job_name}={shown}: no checkpoint in {checkpoint_dir}; "
                     "train first (--mode=train)")
  return step
