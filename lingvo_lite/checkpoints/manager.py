"""Checkpoint saving and restoring with orbax, keyed by step, under JOB/checkpoints/.

Restores into the abstract, sharded state the program already computed, so a checkpoint
lands directly in the current run's shardings (orbax reshards if the mesh changed). A program
that needs only the parameters (eval, decode) restores just that subtree of the saved
TrainState: the optimizer state (Adam's moments, twice the parameters) is neither read into
memory nor allocated.

What can go wrong on disk is handled here, not left to orbax's background threads:
- A save that fails (disk full, permissions, an I/O error) is noticed at the next step
  boundary (`poll`), not one save interval later, and becomes one `CheckpointWriteError`
  (checkpoints/orbax_errors.py); what it left (orbax's temporary folders, a step whose checksums
  could not be written) goes with `discard_failed_saves`.
- A step counts as saved only once it is *verified*: orbax has committed it and process 0
  has recorded every file's checksum (`checkpoint_integrity`), at the first step boundary
  after the commit. A restore checks those checksums first, and never picks a step without
  them unless `restore_unverified` says so: a run killed between the commit and the checksums
  leaves such a step, and it is skipped with a warning.
- Old steps are deleted by this class, not by orbax, and only once a newer step is verified,
  so the newest verified step is never deleted, nor the one `also_keep` names (the newest
  healthy step, which a diverged run resumes from). Deleting renames a step out of orbax's sight
  first, so a kill mid-delete leaves an orphan that the next run removes, not a half step.

Longer than 300 lines with a reason: saving, verifying, deleting old steps and restoring are methods
of one `Checkpointer` that read and update one record of pending, saved and verified steps; split
apart, each part would need that record passed to it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, Iterator

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from lingvo_lite.checkpoints import integrity as checkpoint_integrity
from lingvo_lite.checkpoints.orbax_errors import (READ_ERRORS, CheckpointWriteError, caused_by,
                                                  innermost_cause, silence_closed_loop_errors)
from lingvo_lite.errors import UsageError
from lingvo_lite.fields import PositiveInt

_ITEM = "default"  # The folder orbax writes a single-item step's state to.
_PARAMS = "params"  # The TrainState field a params-only restore reads; orbax keys it so.
_STEP_METADATA_FILE = "_CHECKPOINT_METADATA"
# Folder-name markers of steps being written (orbax's) or being deleted (ours).
_TEMPORARY_MARKERS = (".orbax-checkpoint-tmp", ".lingvo_lite-deleting")
_SET_ASIDE_MARKER = ".unverified"  # A skipped step, kept out of orbax's sight.


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
  """When to save, how many to keep, and what a restore may trust.

  Attributes:
    every_steps: Save every this many steps (and always at the end of training).
    max_to_keep: Newest checkpoints kept on disk; older ones are deleted once a newer one
      is verified, except the newest healthy one (checkpoints/health.py), which a diverged run
      resumes from. None keeps all (0 is refused: it would keep none).
    async_save: Write in a background thread while training continues.
    checksums: Record each file's size and CRC-32 once a step is committed and verify them
      before a restore. Process 0 reads the step back on the training thread, at the first
      step boundary after the commit: one more read of the checkpoint's bytes per save.
    restore_unverified: Restore the newest step even if it has no checksums (its run was
      killed between the commit and recording them). Off: such a step is skipped with a
      warning, and the newest verified step is restored.
  """

  every_steps: PositiveInt = 1000
  max_to_keep: PositiveInt | None = 3
  async_save: bool = True
  checksums: bool = True
  restore_unverified: bool = False


# How long processes other than 0 wait for process 0 to record a step's checksums.
CHECKSUM_WAIT_SECONDS = 3600.0


def _shapes_by_path(tree: Any) -> dict[str, tuple[int, ...]]:
  """'params/layers_0/attention/query/kernel' -> shape, for any pytree of arrays or metadata
  (a TrainState's attributes and a restored dict's keys name a leaf alike)."""
  shapes = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    names = [str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key))))
             for key in path]
    shapes["/".join(names)] = tuple(getattr(leaf, "shape", ()))
  return shapes


class Checkpointer:
  """orbax's CheckpointManager, with verified steps, failure detection and retention.

  Attributes:
    on_verified: Called with the newest step each time saves are verified, on whichever path
      verifies them (`poll`, the next `save`, `close`): what belongs to that step (the
      metrics up to it) is kept from then on. What it raises is raised by that call.
    also_keep: Given the verified steps on disk, the one `max_to_keep` must keep besides the
      newest ones, if any: the train program's newest healthy step (checkpoints/health.py), the
      one a diverged run is told to resume from.
  """

  def __init__(self, directory: epath.Path, settings: CheckpointSettings,
               create: bool = True):
    self._directory = directory
    self._settings = settings
    self.on_verified: Callable[[int], None] = lambda step: None
    self.also_keep: Callable[[list[int]], int | None] = lambda steps: None
    self._pending: list[int] = []  # Saved, not yet committed and checksummed.
    self._saved: set[int] = set()  # Every step this checkpointer started saving.
    self._verified_steps: set[int] = set()  # Checked against their checksums.
    self._reported: set[tuple[str, int]] = set()
    silence_closed_loop_errors()
    self._manager = ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=None,  # Retention is ours: see `_delete_old_steps`.
            save_interval_steps=settings.every_steps,
            enable_async_checkpointing=settings.async_save,
            create=create,
        ),
        # Naming the item's handler lets orbax read a step's metadata without warnings.
        item_handlers=ocp.StandardCheckpointHandler())

  # --------------------------------------------------------------------------- which steps

  def _warn_once(self, kind: str, step: int, message: str, *args: Any) -> None:
    if (kind, step) not in self._reported:
      self._reported.add((kind, step))
      logging.warning(message, *args)

  def _is_complete(self, step: int) -> bool:
    """orbax renames a step's folder into place only once every file is written, with its
    metadata file; a final-named folder without it is an empty or partial copy."""
    step_dir = self._directory / str(step)
    return (step_dir / _STEP_METADATA_FILE).exists() and (step_dir / _ITEM).is_dir()

  def _has_checksums(self, step: int) -> bool:
    return checkpoint_integrity.has_checksums(self._directory / str(step))

  def all_steps(self) -> list[int]:
    """Complete steps on disk, oldest first (see `skipped_steps` for the others)."""
    return [step for step in sorted(self._manager.all_steps())
            if step not in self._pending and self._is_complete(step)]

  def refresh(self) -> None:
    """Looks at the folder again: for a reader (the eval program) of a job that a trainer
    beside it keeps saving to; orbax otherwise lists the steps it saw when it started."""
    self._manager.reload()

  def skipped_steps(self) -> dict[int, str]:
    """Step folders a restore will not use, each with the reason (for messages)."""
    skipped = {}
    for step in sorted(self._manager.all_steps()):
      if step in self._pending:
        continue  # This run's own save, still being written.
      if not self._is_complete(step):
        skipped[step] = (f"step {step} is incomplete (no {_STEP_METADATA_FILE}: an "
                         "interrupted save or a partial copy)")
      elif self._needs_checksums() and not self._has_checksums(step):
        skipped[step] = (f"step {step} has no checksums (its run stopped between writing it "
                         "and recording them; --fdl.checkpoint.restore_unverified=True would "
                         "restore it)")
    return skipped

  def _needs_checksums(self) -> bool:
    return self._settings.checksums and not self._settings.restore_unverified

  def latest_step(self, warn: bool = True) -> int | None:
    """The newest step a restore may use: verified (it has checksums), or any complete one
    where checksums are off or `restore_unverified` allows it. Newer steps it skips are
    warned about; where none is usable, `skipped_steps` says why (no warning: the caller's
    message does)."""
    skipped = self.skipped_steps()
    usable = [step for step in self.all_steps() if step not in skipped]
    if not usable:
      return None
    for step, reason in skipped.items() if warn else ():
      if step > usable[-1]:
        self._warn_once("skipped", step, "checkpoint %s; restoring step %d instead", reason,
                        usable[-1])
    return usable[-1]

  def clean_up_for_training(self, start: int | None) -> None:
    """Before a training run saves its first step (process 0; it holds the job's lock):
    removes folders no run will finish (orbax's temporaries and our interrupted deletes, left
    by a kill) and incomplete step folders, and moves aside complete steps it skipped (no
    checksums): orbax would count those as saved, and refuse to save any step up to theirs.
    One warning line per folder."""
    if jax.process_index() == 0 and self._directory.exists():
      for path in self._temporary_folders():
        logging.warning("removing %s, left by an interrupted save or delete", path)
        path.rmtree()
      skipped = self.skipped_steps()
      resumed = f"training resumes from step {start}" if start else "training starts over"
      for step in sorted(self._manager.all_steps()):
        if step in self._pending or (step not in skipped and step <= (start or 0)):
          continue
        reason = skipped.get(step, f"step {step} is newer than the restored one")
        if self._is_complete(step):
          # Kept, not deleted: the user may still want it (rename it back, and restore it
          # with checkpoint.restore_unverified).
          aside = self._directory / f"{step}{_SET_ASIDE_MARKER}-{time.time_ns()}"
          self._reported.add(("skipped", step))
          logging.warning("checkpoint %s; %s; moved it to %s", reason, resumed, aside)
          (self._directory / str(step)).rename(aside)
        else:
          self._delete_step(step, f"{reason}; {resumed}")
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("lingvo_lite_checkpoint_clean_up")
    self._manager.reload()

  def _temporary_folders(self) -> list[epath.Path]:
    return sorted(path for path in self._directory.iterdir()
                  if any(marker in path.name for marker in _TEMPORARY_MARKERS))

  def discard_failed_saves(self) -> None:
    """After a failed save and `close`: removes what this checkpointer's saves left that no
    run will use (process 0): orbax's temporary folders (a full disk stopped the copy) and
    steps it wrote but could not verify (their checksums could not be written). A failed run
    leaves its earlier checkpoints, and nothing else, in the folder."""
    if jax.process_index() != 0 or not self._directory.exists():
      return
    doomed = self._temporary_folders() + [
        self._directory / str(step) for step in sorted(self._saved - self._verified_steps)
        if (self._directory / str(step)).exists() and not self._has_checksums(step)]
    for path in doomed:
      try:
        path.rmtree()
      except OSError as e:  # The run's own failure is the one to report; the next run retries.
        logging.warning("could not remove %s, left by a failed save: %s", path, e)

  def _delete_step(self, step: int, why: str) -> None:
    step_dir = self._directory / str(step)
    doomed = self._directory / f"{step}{_TEMPORARY_MARKERS[1]}-{time.time_ns()}"
    logging.warning("deleting checkpoint step %d: %s", step, why)
    step_dir.rename(doomed)  # Out of orbax's sight at once; a kill now leaves an orphan.
    doomed.rmtree()

  # --------------------------------------------------------------------------- saving

  def save(self, step: int, state: Any, force: bool = False,
           metadata: dict[str, Any] | None = None) -> bool:
    """Starts saving `step` if it is on the interval (or `force`); returns whether it did.

    `metadata` (JSON-able) is stored with the step, e.g. the layer layout of the state.

    Raises:
      CheckpointWriteError: this save or the previous one failed.
    """
    self.wait()  # orbax waits for the previous save anyway; this also verifies it.
    self._saved.add(step)  # Whatever it left, should it fail, is this run's to remove.
    try:
      saved = self._manager.save(step, args=ocp.args.StandardSave(state), force=force,
                                 custom_metadata=metadata)
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointWriteError(f"saving checkpoint step {step} failed: {innermost_cause(e)}",
                                 e) from e
    if saved:
      self._pending.append(step)
    return saved

  def save_finished(self) -> bool:
    """Whether a save this checkpointer started is written and awaits verification: what
    `poll` would do work for (checksums, on this thread)."""
    return bool(self._pending) and not self._manager.is_saving_in_progress()

  def poll(self) -> list[int]:
    """At a step boundary: verifies the pending save if orbax has finished it.

    Returns:
      The steps verified by this call.

    Raises:
      CheckpointWriteError: the background save failed.
    """
    if not self.save_finished():
      return []
    return self.wait()

  def wait(self) -> list[int]:
    """Waits for pending saves, then checksums them and applies `max_to_keep`.

    Returns:
      The steps verified by this call.

    Raises:
      CheckpointWriteError: a pending save failed (the step is not kept).
    """
    if not self._pending:
      return []
    pending, self._pending = self._pending, []
    try:
      self._manager.wait_until_finished()
      self._manager.check_for_errors()
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointWriteError(
          f"saving checkpoint step {pending[-1]} failed: {innermost_cause(e)}", e) from e
    for step in pending:
      if not self._is_complete(step):
        raise CheckpointWriteError(f"saving checkpoint step {step} failed: orbax reported no "
                                   f"error, but {self._directory / str(step)} is incomplete")
      if self._settings.checksums and jax.process_index() == 0:
        try:
          checkpoint_integrity.write_checksums(self._directory / str(step))
        except OSError as e:
          raise CheckpointWriteError(f"recording the checksums of checkpoint step {step} "
                                     f"failed: {innermost_cause(e)}", e) from e
      elif self._settings.checksums:
        self._await_checksums(step)
      self._verified_steps.add(step)
    self._delete_old_steps()  # First: the space it frees may be what the outputs need.
    self.on_verified(max(pending))
    return pending

  def _await_checksums(self, step: int) -> None:
    """On processes other than 0: waits while process 0 reads the step's every byte for its
    checksums, so that they spend that time here, in the checkpoint's (timed as such, no
    stall to the watchdog), rather than blocked in the next step's collective. Gives up
    after CHECKSUM_WAIT_SECONDS (process 0 failed: its own error stops the run)."""
    step_dir = self._directory / str(step)
    deadline = time.monotonic() + CHECKSUM_WAIT_SECONDS
    while not checkpoint_integrity.has_checksums(step_dir) and time.monotonic() < deadline:
      time.sleep(0.2)

  def verified_steps(self) -> list[int]:
    """Complete steps on disk with their checksums (or verified by this checkpointer)."""
    return [step for step in self.all_steps()
            if step in self._verified_steps or self._has_checksums(step)]

  def _delete_old_steps(self) -> None:
    """Keeps the newest `max_to_keep` complete steps; never the newest verified one, nor the
    one `also_keep` names."""
    keep = self._settings.max_to_keep
    if keep is None or jax.process_index() != 0:
      return
    steps = self.all_steps()
    verified = self.verified_steps()
    protected = {verified[-1], self.also_keep(verified)} if verified else set()
    for step in steps[:-keep] if len(steps) > keep else []:
      if step not in protected:
        self._delete_step(step, f"checkpoint.max_to_keep={keep}")
    self._manager.reload()

  def close(self) -> list[int]:
    """Waits for and verifies pending saves, then releases orbax's threads.

    Raises:
      CheckpointWriteError: a pending save failed (resources are released all the same).
    """
    try:
      verified = self.wait()
    except BaseException:
      with contextlib.suppress(Exception):  # The failure at hand is the one to report.
        self._manager.close()
      raise
    try:
      self._manager.close()
    except Exception as e:  # pylint: disable=broad-except
      # orbax raises a failed background save again here (a full disk): one line, as in wait.
      step = max(self._saved, default=None)
      raise CheckpointWriteError(f"saving checkpoint step {step} failed: {innermost_cause(e)}",
                                 e) from e
    return verified

  # --------------------------------------------------------------------------- restoring

  def metadata(self, step: int) -> dict[str, Any]:
    """The metadata saved with `step` ({} if none), once the step's files are verified."""
    self._verify(step)
    with self._reading(step):
      return dict(self._manager.metadata(step).custom_metadata or {})

  def restore(self, step: int, abstract_state: Any) -> Any:
    """Restores `step` into the shapes, dtypes and shardings of `abstract_state`, after
    checking its files against their checksums and its tree against the state's (UsageError
    naming the first file or parameter that differs)."""
    self._verify(step)
    self._check_tree(step, abstract_state)
    with self._reading(step):
      return self._manager.restore(step, args=ocp.args.StandardRestore(abstract_state))

  def restore_params(self, step: int, abstract_params: Any, fix: str | None = None) -> Any:
    """Restores only the parameters of the TrainState saved at `step`, into the shapes,
    dtypes and shardings of `abstract_params`; returns the plain parameter tree.

    The optimizer state is skipped on disk: no array of it is read or allocated. The same
    checks as `restore` come first: the step's checksums (over all its files: orbax packs
    parameters and moments into shared data files), then the saved parameters' tree against
    `abstract_params`. `fix` replaces the advice of a tree that does not fit (a warm start's
    is not a resume's).
    """
    self._verify(step)
    wanted = {_PARAMS: abstract_params}
    self._check_tree(step, wanted, subtree=_PARAMS, fix=fix)
    # The manager's StandardCheckpointHandler has no partial restore (orbax 0.12 refuses
    # PLACEHOLDER leaves in it), so the PyTree handler it wraps reads the same item folder
    # directly; `partial_restore` trims the saved tree to `wanted` before anything is read.
    reader = ocp.Checkpointer(ocp.PyTreeCheckpointHandler())
    with self._reading(step), contextlib.closing(reader):
      restored = reader.restore(
          self._directory / str(step) / _ITEM,
          args=ocp.args.PyTreeRestore(
              item=wanted, restore_args=ocp.checkpoint_utils.construct_restore_args(wanted),
              partial_restore=True))
    return restored[_PARAMS]

  @contextlib.contextmanager
  def _reading(self, step: int) -> Iterator[None]:
    """orbax's errors reading a damaged step (checksums off, or damage they cannot see:
    a file edited before they were written) as one line naming the step and the way out."""
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except
      # orbax wraps tensorstore's read errors (a truncated data file) in a bare Exception
      # ("Encountered error while reading array index"), so the chain's causes decide.
      if not caused_by(e, READ_ERRORS):
        raise
      earlier = [s for s in self.all_steps() if s < step]
      fix = (f"resume from step {max(earlier)}" if earlier else "start from scratch")
      raise UsageError(f"checkpoint step {step} in {self._directory} is unreadable "
                       f"({innermost_cause(e)}); move {self._directory / str(step)} out of the way "
                       f"to {fix}") from None

  def _check_tree(self, step: int, abstract_state: Any, subtree: str | None = None,
                  fix: str | None = None) -> None:
    """The saved arrays' paths and shapes must be the state's (with `subtree`, only the saved
    arrays under that top-level key are compared): orbax would otherwise fail deep inside
    tensorstore, or silently broadcast or truncate."""
    with self._reading(step):
      saved = _shapes_by_path(self._manager.item_metadata(step))
    if subtree is not None:
      saved = {path: shape for path, shape in saved.items()
               if path == subtree or path.startswith(f"{subtree}/")}
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
      differs = "model" if subtree else "model or optimizer"  # A params read skips the rest.
      fix = fix or ("use the job's own config (its config.json), or a new --job_log_dir")
      raise UsageError(f"checkpoint step {step} in {self._directory} does not fit this config: "
                       f"{problem}; the {differs} differs from the one that wrote it: {fix}")

  def _verify(self, step: int) -> None:
    """Process 0 checks the files; every process learns the verdict, so all stop together."""
    if not self._settings.checksums or step in self._verified_steps:
      return
    step_dir = self._directory / str(step)
    problem = None
    if jax.process_index() == 0:
      if checkpoint_integrity.has_checksums(step_dir):
        problem = checkpoint_integrity.first_mismatch(step_dir)
      else:
        self._warn_once("restoring unverified", step, "restoring checkpoint step %d without "
                        "checksums (checkpoint.restore_unverified)", step)
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
