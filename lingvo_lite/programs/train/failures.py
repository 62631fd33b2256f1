"""How a training run fails: the errors that stop it (exit code 1), each one line, and the
advice that line ends with (where to resume, what to change)."""

from __future__ import annotations

import math
import os

from etils import epath

from lingvo_lite.checkpoints import health as checkpoint_health
from lingvo_lite.checkpoints.manager import Checkpointer
from lingvo_lite.errors import UsageError, os_error_text
from lingvo_lite.programs import ProgramFailure


class TrainingFailure(ProgramFailure):
  """The run started but cannot go on (exit code 1): a non-finite loss, for instance."""


class OutputWriteError(TrainingFailure):
  """A file of the job dir besides the checkpoints (config, metrics, run info) could not be
  written: one line naming it and the operating system's reason (`errno`)."""

  def __init__(self, message: str, error_number: int | None):
    super().__init__(message)
    self.errno = error_number


def write_advice(error_number: int | None) -> str:
  """How to go on after a failed write, by its errno (the disk is full: free space)."""
  if not error_number:
    return "free space or fix the job folder's permissions, then rerun the same command"
  _, fix = os_error_text(OSError(error_number, os.strerror(error_number)),
                         "move the job folder where it can be written")
  return f"{fix}, then rerun the same command"


def newest_checkpoint(checkpointer: Checkpointer) -> str:
  """Where a rerun would resume, for the messages of a failed run."""
  try:
    step = checkpointer.latest_step()
  except UsageError:
    step = None
  return (f"the newest checkpoint is step {step}" if step is not None
          else "no checkpoint was saved yet")


_NON_FINITE_FIX = ("rerun with a lower optimizer.peak_learning_rate (or a clip_grad_norm, "
                   "longer warmup_steps): a resumed run may change the optimizer's settings")


def resume_advice(checkpointer: Checkpointer, health: checkpoint_health.TrainingHealth,
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


class NonFinite(TrainingFailure):
  """A non-finite loss or state at `step`; `run` adds where to resume and what to change."""

  def __init__(self, message: str, step: int):
    super().__init__(message)
    self.step = step


def check_finite(loss: float, step: int) -> None:
  if not math.isfinite(loss):
    raise NonFinite(f"loss is {loss} at step {step}; stopped without saving it", step)
