"""The parameters a program that does not train uses: the job's own checkpoint, else the
weight source its config starts from (`train.init_from`).

A job dir whose config names a source (a Hugging Face folder, another job) and that has no
checkpoint of its own yet is that source's model: export, like train, reads the source's
parameters. A job with a checkpoint reads its own (its newest usable step, or the one asked
for); asking for a step of a job that has none is refused as before, naming the job.
"""

from __future__ import annotations

from typing import Any

from etils import epath

from lingvo_lite.checkpoints import selection as checkpoint_selection
from lingvo_lite.checkpoints.params import MeshParams


def restore(setup: Any, mesh_params: MeshParams, job_dir: epath.Path, shown_job: epath.Path,
            wanted_step: int | None) -> tuple[Any, str, int | None]:
  """(the parameters in `mesh_params`' shardings, what they are, the job's step or None).

  Raises:
    UsageError: no usable checkpoint and no source, the step asked for is not there, or the
      source cannot be read (one line each).
  """
  checkpoint_dir = job_dir / "checkpoints"
  checkpointer = checkpoint_selection.open_existing(checkpoint_dir, setup.checkpoint)
  source = setup.train.init_from
  has_own = checkpointer is not None and checkpointer.latest_step(warn=False) is not None
  if has_own or wanted_step is not None or source is None:
    step = checkpoint_selection.chosen_step(checkpointer, checkpoint_dir, wanted_step,
                                            shown_job)
    return mesh_params.restore(checkpointer, step), f"step {step} of {shown_job}", step
  params, loaded = source.load_params(mesh_params)
  return params, f"{loaded} (train.init_from: {shown_job} has no checkpoint yet)", None
