"""The processes of a multi-process eval agree: process 0 decides (which step, which sets, when
to stop), and every process follows, so that all go on, or none, into the evaluation's
collectives."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from etils import epath

from lingvo_lite.checkpoints import selection as checkpoint_selection
from lingvo_lite.checkpoints.manager import Checkpointer
from lingvo_lite.errors import UsageError
from lingvo_lite.on_mesh.jitted import JittedSteps

STOP, WAIT = -2, -1  # What process 0 tells the others instead of a step to evaluate.


class RestoreFailed(Exception):
  """The checkpoint could not be restored (on this process or another): tried again later."""


def agree(values: list[int]) -> list[int]:
  """Process 0's `values` (steps, flags), on every process."""
  if jax.process_count() == 1:
    return list(values)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return [int(v) for v in multihost_utils.broadcast_one_to_all(np.asarray(values, np.int32))]


def agreed_restore(jitted: JittedSteps, checkpointer: Checkpointer, step: int) -> Any:
  """The step's parameters, or RestoreFailed on every process when any process failed (a
  damaged step, or one the trainer's retention deleted mid-restore)."""
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
    raise RestoreFailed(problem)
  return params


def agreed_step(checkpointer: Checkpointer | None, checkpoint_dir: epath.Path,
                wanted: int | None, shown: epath.Path) -> int:
  """Process 0's choice (checkpoints/selection.py), on every process: beside a running
  trainer, two processes listing the folder can see different steps."""
  step, problem = WAIT, None
  if jax.process_index() == 0:
    try:
      step = checkpoint_selection.chosen_step(checkpointer, checkpoint_dir, wanted, shown)
    except UsageError as e:
      problem = e
  step = agree([step])[0]
  if problem is not None:
    raise problem
  if step < 0:
    raise UsageError(f"--job_log_dir={shown}: process 0 found no checkpoint to evaluate in "
                     f"{checkpoint_dir} (its own message says why)")
  return step
