"""Checkpoint saving and restoring with orbax, keyed by step, under JOB/checkpoints/.

Restores into the abstract, sharded state the program already computed, so a checkpoint
lands directly in the current run's shardings (orbax reshards if the mesh changed).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orbax.checkpoint as ocp
from etils import epath


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
  """When to save and how many to keep.

  Attributes:
    every_steps: Save every this many steps (and always at the end of training).
    max_to_keep: Newest checkpoints kept on disk; older ones are deleted.
    async_save: Write in a background thread while training continues.
  """

  every_steps: int = 1000
  max_to_keep: int = 3
  async_save: bool = True


class Checkpointer:
  """A thin wrapper over orbax's CheckpointManager with the three calls programs need."""

  def __init__(self, directory: epath.Path, settings: CheckpointSettings,
               create: bool = True):
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
    return self._manager.save(step, args=ocp.args.StandardSave(state), force=force,
                              custom_metadata=metadata)

  def metadata(self, step: int) -> dict[str, Any]:
    """The metadata saved with `step` ({} if none)."""
    return dict(self._manager.metadata(step).custom_metadata or {})

  def restore(self, step: int, abstract_state: Any) -> Any:
    """Restores `step` into the shapes, dtypes and shardings of `abstract_state`."""
    return self._manager.restore(step, args=ocp.args.StandardRestore(abstract_state))

  def close(self) -> None:
    """Waits for pending asynchronous saves, then releases resources."""
    self._manager.wait_until_finished()
    self._manager.close()
