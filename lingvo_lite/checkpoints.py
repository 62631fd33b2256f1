"""Checkpoint saving and restoring with orbax, keyed by step, under JOB/checkpoints/.

Restores into the abstract, sharded state the program already computed, so a checkpoint
lands directly in the current run's shardings (orbax reshards if the mesh changed). Each
finished step gets checksums (`checkpoint_integrity`), verified before it is restored.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from lingvo_lite import checkpoint_integrity
from lingvo_lite.errors import UsageError


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
  """When to save and how many to keep.

  Attributes:
    every_steps: Save every this many steps (and always at the end of training).
    max_to_keep: Newest checkpoints kept on disk; older ones are deleted.
    async_save: Write in a background thread while training continues.
    checksums: Record each file's size and CRC-32 once a step is written and verify them
      before a restore. Process 0 reads the step back on the training thread when the next
      save starts (or at the end): one more read of the checkpoint's bytes per save.
  """

  every_steps: int = 1000
  max_to_keep: int = 3
  async_save: bool = True
  checksums: bool = True


class Checkpointer:
  """A thin wrapper over orbax's CheckpointManager with the three calls programs need."""

  def __init__(self, directory: epath.Path, settings: CheckpointSettings,
               create: bool = True):
    self._directory = directory
    self._checksums = settings.checksums
    self._steps_without_checksums: list[int] = []
    self._verified_steps: set[int] = set()
    self._manager = ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=settings.max_to_keep,
            save_interval_steps=settings.every_steps,
            enable_async_checkpointing=settings.async_save,
            create=create,
        ))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, force: bool = False,
           metadata: dict[str, Any] | None = None) -> bool:
    """Saves if `step` is on the interval (or `force`); returns whether it saved.

    `metadata` (JSON-able) is stored with the step, e.g. the layer layout of the state.
    """
    # orbax finishes the previous asynchronous save before starting one, so waiting here
    # first costs nothing and lets that step's checksums be written.
    self._write_pending_checksums()
    saved = self._manager.save(step, args=ocp.args.StandardSave(state), force=force,
                               custom_metadata=metadata)
    if saved and self._checksums:
      self._steps_without_checksums.append(step)
    return saved

  def metadata(self, step: int) -> dict[str, Any]:
    """The metadata saved with `step` ({} if none), once the step's files are verified."""
    self._verify(step)
    return dict(self._manager.metadata(step).custom_metadata or {})

  def restore(self, step: int, abstract_state: Any) -> Any:
    """Restores `step` into the shapes, dtypes and shardings of `abstract_state`, after
    checking its files against their checksums (UsageError naming the first that differs)."""
    self._verify(step)
    return self._manager.restore(step, args=ocp.args.StandardRestore(abstract_state))

  def close(self) -> None:
    """Waits for pending asynchronous saves, writes their checksums, releases resources."""
    self._write_pending_checksums()
    self._manager.close()

  def _write_pending_checksums(self) -> None:
    self._manager.wait_until_finished()
    if jax.process_index() == 0:
      for step in self._steps_without_checksums:
        step_dir = self._directory / str(step)
        if step_dir.exists():  # max_to_keep may have deleted it already.
          checkpoint_integrity.write_checksums(step_dir)
    self._steps_without_checksums = []

  def _verify(self, step: int) -> None:
    """Process 0 checks the files; every process learns the verdict, so all stop together."""
    if not self._checksums or step in self._verified_steps:
      return
    step_dir = self._directory / str(step)
    problem = None
    if jax.process_index() == 0:
      if checkpoint_integrity.has_checksums(step_dir):
        problem = checkpoint_integrity.first_mismatch(step_dir)
      else:
        logging.warning("checkpoint step %d has no checksums (written before they existed, "
                        "or the run stopped before recording them); restoring unverified",
                        step)
    if jax.process_count() > 1:
      corrupt = multihost_utils.broadcast_one_to_all(np.int32(problem is not None))
      if corrupt and problem is None:
        problem = "process 0 found a file that differs from its checksum"
    if problem is not None:
      earlier = [s for s in self.all_steps() if s < step]
      fix = (f"move {step_dir} out of the way to resume from step {max(earlier)}" if earlier
             else f"move {step_dir} out of the way to start from scratch")
      raise UsageError(f"checkpoint step {step} is corrupt: {problem}; {fix}")
    self._verified_steps.add(step)
