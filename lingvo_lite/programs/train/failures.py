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
  """Where a diverged run should resume: the newest healthy checkpoint (retention keeps it)
  that passes a restore's checks (Checkpointer.sound), with the rule that says so and the
  diverged or damaged steps after it to move away."""
  steps = checkpointer.usable_steps()
  if not steps:
    return f"no checkpoint was saved yet; {_NON_FINITE_FIX}"
  rule = f"healthy: {checkpoint_health.RULE}"
  damaged = []  # Healthy by the rows, refused by a restore's checks (a copy, a flipped byte).
  healthy = None
  for step in reversed(steps):
    if health.healthy(step):
      if checkpointer.sound(step):
        healthy = step
        break
      damaged.append(step)
  if healthy == steps[-1]:
    return f"the newest checkpoint, step {healthy}, is healthy ({rule}); {_NON_FINITE_FIX}"
  diverged = [step for step in steps if step > (healthy or 0) and step not in damaged]
  after_it = " after it" if healthy is not None else ""
  after = " and ".join(part for part in (
      f"{_listed(diverged)}{after_it} had diverged already" if diverged else "",
      f"{_listed(sorted(damaged))} {'is' if len(damaged) == 1 else 'are'} damaged"
      if damaged else "") if part)
  moved = "it" if len(diverged) + len(damaged) == 1 else "them"
  if healthy is None:
    return (f"no checkpoint is healthy ({rule}): {after}; move {moved} out of {folder} to "
            f"start over, then {_NON_FINITE_FIX}")
  return (f"the newest healthy checkpoint is step {healthy} ({rule}); {after}: move {moved} "
          f"out of {folder} to resume from step {healthy}, then {_NON_FINITE_FIX}")


def _listed(steps: list[int]) -> str:
  """`step 4`, `steps 4 and 6`, `steps 2, 4 and 6`, or `the 9 steps 2 to 18`."""
  if len(steps) == 1:
    return f"step {steps[0]}"
  if len(steps) <= 4:
    return f"steps {', '.join(map(str, steps[:-1]))} and {steps[-1]}"
  return f"the {len(steps)} steps {steps[0]} to {steps[-1]}"


class NonFinite(TrainingFailure):
  """A non-finite loss or state at `step`; `run` adds where to resume and what to change."""

  def __init__(self, message: str, step: int):
    super().__init__(message)
    self.step = step


def check_finite(loss: float, step: int) -> None:
  if not math.isfinite(loss):
    raise NonFinite(f"loss is {loss} at step {step}; stopped without saving it", step)
