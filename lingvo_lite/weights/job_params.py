"""The parameters a program that does not train uses: the job's own checkpoint, else the
weight source its config starts from (`train.init_from`).

A job dir whose config names a source (a Hugging Face folder, another job) and that has no
checkpoint of its own yet is that source's model: export, like train, reads the source's
parameters. A job with a checkpoint reads its own (its newest usable step, or the one asked
for); asking for a step of a job that has none is refused as before, naming the job.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from etils import epath

from lingvo_lite.checkpoints import selection as checkpoint_selection
from lingvo_lite.checkpoints.params import MeshParams


@dataclasses.dataclass(frozen=True)
class ParamsChoice:
  """Where a program's parameters come from: the job's step `step`, else `source`.

  Attributes:
    checkpointer: The job's checkpoint manager (None where it has no checkpoints folder).
    step: The job's step to restore; None where the parameters come from `source`.
    source: The weight source (`train.init_from`) read instead of a checkpoint, or None.
    shown_job: The job dir as the user gave it, for messages.
  """
  checkpointer: Any
  step: int | None
  source: Any
  shown_job: Any

  def describe(self) -> str:
    """'checkpoint step N', or 'train.init_from gguf:PATH' (for summary lines)."""
    if self.step is not None:
      return f"checkpoint step {self.step}"
    return f"train.init_from {self.source.describe()}"


def choose(setup: Any, job_dir: epath.Path, shown_job: Any,
           wanted_step: int | None) -> ParamsChoice:
  """The job's own checkpoint (its newest usable step, or `wanted_step`), else the config's
  `train.init_from`, checked before anything is read.

  Raises:
    UsageError: no usable checkpoint and no source, or the step asked for is not there.
  """
  checkpoint_dir = job_dir / "checkpoints"
  checkpointer = checkpoint_selection.open_existing(checkpoint_dir, setup.checkpoint)
  source = setup.train.init_from
  has_own = checkpointer is not None and checkpointer.latest_step(warn=False) is not None
  if has_own or wanted_step is not None or source is None:
    step = checkpoint_selection.chosen_step(checkpointer, checkpoint_dir, wanted_step,
                                            shown_job)
    return ParamsChoice(checkpointer, step, None, shown_job)
  return ParamsChoice(checkpointer, None, source, shown_job)


def load(choice: ParamsChoice, mesh_params: MeshParams) -> tuple[Any, str]:
  """(the chosen parameters in `mesh_params`' shardings, what they are).

  Raises:
    UsageError: the source cannot be read (one line).
  """
  if choice.step is not None:
    return (mesh_params.restore(choice.checkpointer, choice.step),
            f"step {choice.step} of {choice.shown_job}")
  params, loaded = choice.source.load_params(mesh_params)
  return params, f"{loaded} (train.init_from: {choice.shown_job} has no checkpoint yet)"


def restore(setup: Any, mesh_params: MeshParams, job_dir: epath.Path, shown_job: epath.Path,
            wanted_step: int | None) -> tuple[Any, str, int | None]:
  """(the parameters in `mesh_params`' shardings, what they are, the job's step or None):
  `choose` then `load`."""
  choice = choose(setup, job_dir, shown_job, wanted_step)
  params, what = load(choice, mesh_params)
  return params, what, choice.step
