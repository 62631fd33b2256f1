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
from lingvo_lite.fields import PositiveInt


_ITEM = "default"  # The folder orbax writes a single-item step's state to.
_STEP_METADATA_FILE = "_CHECKPOINT_METADATA"


def _shapes_by_path(tree: Any) -> dict[str, tuple[int, ...]]:
  """'params/layers_0/attention/query/kernel' -> shape, for any pytree of arrays or metadata
  (a TrainState's attributes and a restored dict's keys name a leaf alike)."""
  shapes = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    names = [str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key))))
             for key in path]
    shapes["/".join(names)] = tuple(getattr(leaf, "shape", ()))
  return shapes


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

  every_steps: PositiveInt = 1000
  max_to_keep: PositiveInt = 3
  async_save: bool = True
  checksums: bool = True


class Checkpointer:
  """A thin wrapper over orbax's CheckpointManager with the three calls programs need."""

  def __init__(self, directory: epath.Path, settings: CheckpointSettings,
               create: bool = True):
    self._directory = directory
    self._checksums = settings.checksums
    self._steps_without_checksums: list[int] = []
    self._reported_incomplete: set[int] = set()
    self._verified_steps: set[int] = set()
    self._manager = ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=settings.max_to_keep,
            save_interval_steps=settings.every_steps,
            enable_async_checkpointing=settings.async_save,
            create=create,
        ),
        # Naming the item's handler lets orbax read a step's metadata without warnings.
        item_handlers=ocp.StandardCheckpointHandler())

  def latest_step(self) -> int | None:
    """The newest complete step; incomplete step folders are skipped with a warning."""
    complete = self.all_steps()
    return complete[-1] if complete else None

  def all_steps(self) -> list[int]:
    """Complete steps, oldest first (see `_is_complete`)."""
    steps = sorted(self._manager.all_steps())
    for step in steps:
      if not self._is_complete(step) and step not in self._reported_incomplete:
        self._reported_incomplete.add(step)
        logging.warning("checkpoint step %d in %s is incomplete (no %s: an interrupted save or "
                        "a partial copy); it is skipped", step, self._directory,
                        _STEP_METADATA_FILE)
    return [step for step in steps if step not in self._reported_incomplete]

  def _is_complete(self, step: int) -> bool:
    """orbax renames a step's folder into place only once every file is written, with its
    metadata file; a final-named folder without it is an empty or partial copy."""
    step_dir = self._directory / str(step)
    return (step_dir / _STEP_METADATA_FILE).exists() and (step_dir / _ITEM).is_dir()

  def discard_incomplete_steps(self) -> None:
    """Deletes incomplete step folders, which orbax would count as saved steps (it then
    refuses to save any step up to theirs). Called by training once its state is in hand."""
    incomplete = [s for s in self._manager.all_steps() if not self._is_complete(s)]
    if not incomplete or jax.process_index() != 0:
      return
    for step in incomplete:
      logging.warning("deleting incomplete checkpoint step folder %s", self._directory / str(step))
      (self._directory / str(step)).rmtree()
    self._manager.reload()

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
    checking its files against their checksums and its tree against the state's (UsageError
    naming the first file or parameter that differs)."""
    self._verify(step)
    self._check_tree(step, abstract_state)
    return self._manager.restore(step, args=ocp.args.StandardRestore(abstract_state))

  def _check_tree(self, step: int, abstract_state: Any) -> None:
    """The saved arrays' paths and shapes must be the state's: orbax would otherwise fail
    deep inside tensorstore, or silently broadcast or truncate."""
    saved = _shapes_by_path(self._manager.item_metadata(step))
    wanted = _shapes_by_path(abstract_state)
    problem = None
    for path, shape in wanted.items():
      if path not in saved:
        problem = f"it has no {path} (this config's state has one of shape {shape})"
      elif saved[path] != shape:
        problem = f"its {path} has shape {saved[path]}, this config's has {shape}"
      if problem:
        break
    else:
      extra = [path for path in saved if path not in wanted]
      if extra:
        problem = f"it holds {extra[0]}, which this config's state has no place for"
    if problem:
      raise UsageError(f"checkpoint step {step} in {self._directory} does not fit this config: "
                       f"{problem}; the model or optimizer differs from the one that wrote it: "
                       "use the job's own config (its config.json), or a new --job_log_dir")

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
