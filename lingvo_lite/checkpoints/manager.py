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
- A step is the step its folder is named for: the checksums record their step, and a restore
  compares the restored state's step counter (read alone where only the parameters are
  restored) with the folder's name. A folder copied or renamed from another step's is refused
  as damaged, and the advice of any refusal names only an earlier step that passes the same
  checks (`sound`).
- Old steps are deleted by this class, not by orbax, and only once a newer step is verified,
  so the newest verified step is never deleted, nor the one `also_keep` names (the newest
  healthy step, which a diverged run resumes from). Only the job's own steps are deleted:
  those this run saved, and those whose record is of this version's form, for their step, by
  this job (`job`: the id a training run takes over from the step it resumes from). A folder
  copied in (from another job, or with an older version's record) is kept, and said so in
  one warning line. What a run removes, and what it moves aside or keeps instead, is
  checkpoints/tidying.py's.

Restoring, and the checks a restore makes, are checkpoints/restoring.py's (a mixin of
`Checkpointer`: it reads the same record of verified and sound steps).

Longer than 300 lines with a reason: listing, saving, verifying and deleting old steps are
methods of one `Checkpointer` that read and update one record of pending, saved and verified
steps; split apart, each part would need that record passed to it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from lingvo_lite.checkpoints import integrity as checkpoint_integrity
from lingvo_lite.checkpoints import saved_state, tidying
from lingvo_lite.checkpoints.orbax_errors import (CheckpointWriteError, innermost_cause,
                                                  silence_closed_loop_errors)
from lingvo_lite.checkpoints.restoring import ITEM, Restoring
from lingvo_lite.fields import PositiveInt

_STEP_METADATA_FILE = "_CHECKPOINT_METADATA"


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


class Checkpointer(Restoring):
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
    self._sound: set[int] = set()  # Passed every check of a restore (`sound`).
    self._reported: set[tuple[str, int]] = set()
    self._job: str | None = None  # See `job`.
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
    return (step_dir / _STEP_METADATA_FILE).exists() and (step_dir / ITEM).is_dir()

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

  def usable_steps(self, skipped: dict[int, str] | None = None) -> list[int]:
    """Complete steps a restore may pick (none of `skipped_steps`), oldest first; whether
    each passes a restore's checks is `sound`'s to say."""
    skipped = self.skipped_steps() if skipped is None else skipped
    return [step for step in self.all_steps() if step not in skipped]

  def _needs_checksums(self) -> bool:
    return self._settings.checksums and not self._settings.restore_unverified

  def latest_step(self, warn: bool = True) -> int | None:
    """The newest step a restore may use: verified (it has checksums), or any complete one
    where checksums are off or `restore_unverified` allows it. Newer steps it skips are
    warned about; where none is usable, `skipped_steps` says why (no warning: the caller's
    message does)."""
    skipped = self.skipped_steps()
    usable = self.usable_steps(skipped)
    if not usable:
      return None
    for step, reason in skipped.items() if warn else ():
      if step > usable[-1]:
        self._warn_once("skipped", step, "checkpoint %s; restoring step %d instead", reason,
                        usable[-1])
    return usable[-1]

  @property
  def job(self) -> str:
    """The id this checkpointer records its steps under: the job's, taken over from the
    record of the step a training run resumes from (`clean_up_for_training`,
    `_job_resumed`); new where the run starts over, resumes from a step of an older record
    form, or saves without saying."""
    if self._job is None:
      self._job = uuid.uuid4().hex
    return self._job

  def clean_up_for_training(self, start: int | None) -> None:
    """Before a training run saves its first step (process 0; it holds the job's lock):
    takes over the job id of step `start` (`job`); removes the folders no run will finish
    (orbax's temporaries and our interrupted deletes, left by a kill) and moves aside what is
    in the way of the steps it will save: the steps it skipped (orbax would count those as
    saved, and refuse to save any step up to theirs), those newer than `start`, and files
    named like steps; warns of each older step folder it keeps that is not the job's own or
    fails a quick check (checkpoints/tidying.py). One warning line per entry."""
    if jax.process_index() == 0 and self._directory.exists():
      if start is not None:
        self._job = self._job_resumed(start)
      moved = tidying.tidy_for_training(self._directory, start, self._manager.all_steps(),
                                        self.skipped_steps(), self._pending)
      self._reported.update(("skipped", step) for step in moved)
      if start is not None:
        kept = tidying.warn_of_older_steps(self._directory, start, self.usable_steps(),
                                           self.job)
        self._reported.update(("kept", step) for step in kept)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("lingvo_lite_checkpoint_clean_up")
    self._manager.reload()

  def _job_resumed(self, start: int) -> str | None:
    """The job id in the record of step `start`; where it has no record of this version's
    form (restored unverified), the one id that all such records of the earlier steps name,
    if they agree (a copy from another job among them makes them disagree: then none)."""
    job = checkpoint_integrity.recorded_job(self._directory / str(start))
    if job is not None:
      return job
    earlier = {checkpoint_integrity.recorded_job(self._directory / str(step))
               for step in self.all_steps() if step < start} - {None}
    return earlier.pop() if len(earlier) == 1 else None

  def discard_failed_saves(self) -> None:
    """After a failed save and `close`: removes what this checkpointer's saves left that no
    run will use (process 0): orbax's temporary folders (a full disk stopped the copy) and
    steps it wrote but could not verify (their checksums could not be written). A failed run
    leaves its earlier checkpoints, and nothing else, in the folder."""
    if jax.process_index() != 0 or not self._directory.exists():
      return
    tidying.remove_failed_saves(self._directory, [
        step for step in sorted(self._saved - self._verified_steps)
        if (self._directory / str(step)).exists() and not self._has_checksums(step)])

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
      saved = self._manager.save(step, args=ocp.args.StandardSave(saved_state.on_disk(state)),
                                 force=force, custom_metadata=metadata)
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

    Each process sees its own save finish, so processes reach this at different steps.
    Processes other than 0 therefore do not wait here for process 0's checksums: process 0
    may have gone on to dispatch the next step and be waiting for it, and that step's
    collectives need this process (a two-process run hung that way, each waiting for the
    other). They wait for them only in `save` and `close`, which every process reaches at the
    same step.

    Returns:
      The steps verified by this call.

    Raises:
      CheckpointWriteError: the background save failed.
    """
    if not self.save_finished():
      return []
    return self.wait(await_checksums=False)

  def wait(self, await_checksums: bool = True) -> list[int]:
    """Waits for pending saves, then checksums them and applies `max_to_keep`.

    Args:
      await_checksums: On processes other than 0, also wait for process 0 to record each
        step's checksums (`_await_checksums`); only where every process waits at the same
        step (see `poll`).

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
          checkpoint_integrity.write_checksums(self._directory / str(step), step, self.job)
        except OSError as e:
          raise CheckpointWriteError(f"recording the checksums of checkpoint step {step} "
                                     f"failed: {innermost_cause(e)}", e) from e
      elif self._settings.checksums and await_checksums:
        self._await_checksums(step)
      self._verified_steps.add(step)
      self._sound.add(step)  # Its counter is the state's this run saved.
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
    """Complete steps on disk with their checksums (or verified by this checkpointer), but
    for those whose checksums name another step (a copied or renamed folder)."""
    return [step for step in self.all_steps()
            if step in self._verified_steps or (self._has_checksums(step)
                                                and not self._names_another_step(step))]

  def _names_another_step(self, step: int) -> bool:
    return checkpoint_integrity.step_mismatch(self._directory / str(step), step) is not None

  def _delete_old_steps(self) -> None:
    """Keeps the newest `max_to_keep` of the job's own complete steps (`_own_steps`); never
    the newest verified one, nor the one `also_keep` names. Older steps that are not its own
    are kept, in one warning line (once each)."""
    keep = self._settings.max_to_keep
    if keep is None or jax.process_index() != 0:
      return
    steps, others = self._own_steps()
    verified = self.verified_steps()
    protected = {verified[-1], self.also_keep(verified)} if verified else set()
    for step in steps[:-keep] if len(steps) > keep else []:
      if step not in protected:
        tidying.delete_step(self._directory, step, f"checkpoint.max_to_keep={keep}")
    unreported = {step: why for step, why in others.items()
                  if steps and step < steps[-1] and ("kept", step) not in self._reported}
    if unreported:
      tidying.warn_kept(self._directory, unreported, f"checkpoint.max_to_keep={keep}")
      self._reported.update(("kept", step) for step in unreported)
    self._manager.reload()

  def _own_steps(self) -> tuple[list[int], dict[int, str]]:
    """(the complete steps retention may delete, oldest first: those this run saved and
    verified, and those recorded in this version's form, for their step, by this job; the
    others, each with why it is not the job's own). A folder copied in from another job, or
    from an older version's run, is not this program's to delete."""
    own, others = [], {}
    for step in self.all_steps():
      why = None if step in self._saved and step in self._verified_steps else (
          checkpoint_integrity.not_own(self._directory / str(step), step, self.job))
      if why is None:
        own.append(step)
      else:
        others[step] = why
    return own, others

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
