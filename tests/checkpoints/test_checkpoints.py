"""Retention: old steps go only once a newer one is verified, never the newest verified one.
Every path that verifies a step reports it; a failed save leaves only the verified steps; the
newest healthy step (checkpoints/health.py's rule) is kept too."""

import errno
import json
import logging
import os
import shutil
import threading
import time

import jax.numpy as jnp
import pytest
from etils import epath

from lingvo_lite.checkpoints import integrity as checkpoint_integrity
from lingvo_lite.checkpoints.orbax_errors import CheckpointWriteError
from lingvo_lite.checkpoints.health import TrainingHealth
from lingvo_lite.checkpoints.manager import CheckpointSettings, Checkpointer


def _steps(directory):
  return sorted(int(p.name) for p in epath.Path(directory).iterdir() if p.name.isdigit())


def test_old_steps_are_deleted_only_after_a_newer_one_is_verified(tmp_path):
  checkpointer = Checkpointer(epath.Path(tmp_path), CheckpointSettings(
      every_steps=1, max_to_keep=1, async_save=True))
  state = {"w": jnp.arange(4.0)}
  checkpointer.save(1, state)
  assert checkpointer.wait() == [1]
  checkpointer.save(2, state)
  # orbax has committed step 2 (where orbax's own max_to_keep would delete step 1), but it is
  # not verified yet: step 1 is still the one to resume from.
  checkpointer._manager.wait_until_finished()  # pylint: disable=protected-access
  assert _steps(tmp_path) == [1, 2]
  assert checkpointer.wait() == [2]
  assert _steps(tmp_path) == [2]
  assert checkpoint_integrity.has_checksums(epath.Path(tmp_path) / "2")
  checkpointer.close()


def test_the_newest_verified_step_survives_a_newer_unverified_one(tmp_path):
  checkpointer = Checkpointer(epath.Path(tmp_path), CheckpointSettings(
      every_steps=1, max_to_keep=1))
  checkpointer.save(3, {"w": jnp.ones(4)})
  checkpointer.wait()
  # A complete step without checksums, as a kill between commit and checksums leaves one.
  shutil.copytree(tmp_path / "3", tmp_path / "5")
  (tmp_path / "5" / checkpoint_integrity.CHECKSUMS_FILE).unlink()
  checkpointer._delete_old_steps()  # pylint: disable=protected-access
  assert _steps(tmp_path) == [3, 5]  # max_to_keep=1, but 3 is the newest verified step.
  assert checkpointer.latest_step() == 3
  checkpointer.close()


def test_a_failed_save_is_named_by_the_operating_systems_words_in_any_form():
  # tensorstore quotes the OS error with its code in data writes, and without it in some
  # metadata writes (`.zarray`), past the 240 characters a message keeps: seen in 1 of ~10
  # runs of test_faults' file-size-limit case.
  from lingvo_lite.checkpoints.orbax_errors import innermost_cause  # pylint: disable=g-import-not-at-top
  long_path = "/job/checkpoints/3.orbax-checkpoint-tmp/" + "d" * 300
  with_code = ValueError(f"Error writing {long_path}: File too large [os_error_code='27']")
  try:
    try:
      raise OSError(f"Failed writing {long_path}.zarray: File too large")
    except OSError as inner:
      raise ValueError("OUT_OF_RANGE: Error opening \"zarr\" driver") from inner
  except ValueError as without_code:
    for error in (with_code, without_code):
      assert "File too large (errno 27); " in innermost_cause(error), innermost_cause(error)


def test_other_processes_wait_in_the_checkpoint_for_process_0s_checksums(tmp_path,
                                                                         monkeypatch):
  """Process 1 spends process 0's checksum pass in `wait` (timed as checkpointing, no stall),
  not in the next step's collective; process 0 here is a thread that records them late."""
  from lingvo_lite.checkpoints import manager as checkpoints  # pylint: disable=g-import-not-at-top
  checkpointer = Checkpointer(epath.Path(tmp_path), CheckpointSettings(
      every_steps=1, max_to_keep=None, async_save=True))
  checkpointer.save(1, {"w": jnp.arange(4.0)})
  checkpointer._manager.wait_until_finished()  # pylint: disable=protected-access
  monkeypatch.setattr(checkpoints.jax, "process_index", lambda: 1)
  late = threading.Timer(1.0, checkpoint_integrity.write_checksums,
                         (epath.Path(tmp_path) / "1", 1, checkpointer.job))
  started = time.monotonic()
  late.start()
  assert checkpointer.wait() == [1]
  assert time.monotonic() - started >= 0.9
  assert checkpoint_integrity.has_checksums(epath.Path(tmp_path) / "1")
  checkpointer.close()


def test_other_processes_do_not_wait_for_process_0s_checksums_at_a_step_boundary(
    tmp_path, monkeypatch):
  """`poll` runs where each process sees its own save finish, so process 0 may be in the next
  step, which needs process 1: there process 1 must not wait for the checksums (a two-process
  run hung so). Process 0 here never records them."""
  from lingvo_lite.checkpoints import manager as checkpoints  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(checkpoints, "CHECKSUM_WAIT_SECONDS", 60.0)
  checkpointer = Checkpointer(epath.Path(tmp_path), CheckpointSettings(
      every_steps=1, max_to_keep=None, async_save=True))
  checkpointer.save(1, {"w": jnp.arange(4.0)})
  checkpointer._manager.wait_until_finished()  # pylint: disable=protected-access
  monkeypatch.setattr(checkpoints.jax, "process_index", lambda: 1)
  started = time.monotonic()
  assert checkpointer.poll() == [1]
  assert time.monotonic() - started < 30
  assert not checkpoint_integrity.has_checksums(epath.Path(tmp_path) / "1")
  checkpointer.close()


def test_every_path_that_verifies_a_step_reports_it(tmp_path):
  # The train program keeps a step's metric rows when it hears of it: a step verified by the
  # next save (not by poll) was once never reported, and a later failure took its rows back.
  checkpointer = Checkpointer(epath.Path(tmp_path), CheckpointSettings(
      every_steps=1, max_to_keep=None, async_save=True))
  heard = []
  checkpointer.on_verified = heard.append
  state = {"w": jnp.arange(4.0)}
  checkpointer.save(1, state)
  checkpointer.save(2, state)  # Verifies step 1 first.
  assert heard == [1]
  checkpointer._manager.wait_until_finished()  # pylint: disable=protected-access
  assert checkpointer.poll() == [2] and heard == [1, 2]
  checkpointer.save(3, state)
  assert checkpointer.close() == [3] and heard == [1, 2, 3]


def test_a_failed_save_leaves_only_the_verified_steps(tmp_path, monkeypatch):
  from lingvo_lite.checkpoints import manager as checkpoints  # pylint: disable=g-import-not-at-top
  directory = epath.Path(tmp_path)
  checkpointer = Checkpointer(directory, CheckpointSettings(every_steps=1, max_to_keep=None))
  state = {"w": jnp.arange(4.0)}
  checkpointer.save(1, state)
  checkpointer.wait()
  # Step 2's checksums cannot be written (a full disk), and an interrupted write of step 3
  # (orbax's temporary folder) is there too.
  def no_room(step_dir, step, job):
    (step_dir / (checkpoint_integrity.CHECKSUMS_FILE + ".tmp")).write_text("{")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  monkeypatch.setattr(checkpoints.checkpoint_integrity, "write_checksums", no_room)
  checkpointer.save(2, state)
  shutil.copytree(directory / "1", directory / "3.orbax-checkpoint-tmp")
  with pytest.raises(CheckpointWriteError, match="checksums of checkpoint step 2 failed: .*No "
                     "space left on device"):
    checkpointer.close()
  checkpointer.discard_failed_saves()
  assert [p.name for p in directory.iterdir()] == ["1"]
  assert checkpointer.latest_step() == 1


def test_a_step_is_healthy_by_the_first_row_after_it_against_the_lowest_so_far():
  rows = [{"step": 1, "loss": 6.0, "grad_norm": 2.0}, {"step": 2, "loss": 5.0, "grad_norm": 1.0},
          {"step": 4, "loss": 9.0, "grad_norm": 1.5}, {"step": 5, "loss": 11.0, "grad_norm": 1.0},
          {"step": 6, "loss": 7.0, "grad_norm": 101.0}, {"step": 8, "loss": 6.0}]
  health = TrainingHealth(rows)
  # Step 1: row 2. Step 3: row 4 (9 <= 2 x 5). Step 4: row 5 (11 > 10). Step 5: row 6's
  # gradient norm (101 > 100 x 1). Step 6: row 8 (no gradient norm logged). Step 8: no row yet.
  assert [health.healthy(step) for step in (1, 3, 4, 5, 6, 8)] == [
      True, True, False, False, True, None]
  assert health.newest_healthy([3, 4, 5]) == 3
  health.add_failure(9)  # A non-finite state at step 9: step 8 diverged.
  assert health.healthy(8) is False and health.newest_healthy([3, 8]) == 3
  # A resumed run judges by the whole run's lowest loss (the rows it read), not its own.
  resumed = TrainingHealth(rows[:2])
  resumed.add(3, 40.0)
  resumed.add(4, 41.0)
  assert resumed.healthy(2) is False and TrainingHealth([{"step": 3, "loss": 40.0}, {
      "step": 4, "loss": 41.0}]).healthy(3) is True


def test_retention_keeps_the_newest_healthy_step(tmp_path):
  checkpointer = Checkpointer(epath.Path(tmp_path), CheckpointSettings(
      every_steps=1, max_to_keep=1))
  checkpointer.also_keep = lambda steps: 2 if 2 in steps else None
  for step in (1, 2, 3, 4):
    checkpointer.save(step, {"w": jnp.arange(4.0)})
    checkpointer.wait()
  assert _steps(tmp_path) == [2, 4]
  checkpointer.close()


def test_retention_deletes_only_the_jobs_own_steps_and_says_what_it_keeps(tmp_path, caplog):
  """Steps 1-4 of a job; then step 1's record rewritten in format 1 (an older version's), step
  2's as another job's (a copied folder), a file of step 3 cut short. The next run resumes
  from step 4 and takes over its job: one line for each of steps 1-3 at its start, and
  max_to_keep=1 deletes only the job's own steps (3 and 4, then 5). A run that did not take
  over the job (no clean-up, a new id) deletes none of them, in one line."""
  directory = epath.Path(tmp_path)
  state = {"w": jnp.arange(4.0)}
  first = Checkpointer(directory, CheckpointSettings(every_steps=1, max_to_keep=None))
  for step in (1, 2, 3, 4):
    first.save(step, state)
  first.close()
  record = lambda step: directory / str(step) / checkpoint_integrity.CHECKSUMS_FILE
  record(1).write_text(json.dumps(json.loads(record(1).read_text())["files"]))
  record(2).write_text(record(2).read_text().replace(first.job, "another job"))
  cut = directory / "3" / "_CHECKPOINT_METADATA"
  cut.write_text(cut.read_text()[:-1])
  caplog.set_level(logging.WARNING)

  resumed = Checkpointer(directory, CheckpointSettings(every_steps=1, max_to_keep=1))
  resumed.clean_up_for_training(4)
  assert resumed.job == first.job
  for step in (5, 6):
    resumed.save(step, state)
  resumed.close()
  lines = [r.getMessage() for r in caplog.records]
  about = lambda step: [line for line in lines if f"step {step} " in line]
  assert about(1) == [f"checkpoint step 1 ({directory / '1'}) is not this job's own: its "
                      "lingvo_lite_checksums.json is of record format 1, not 3 (written by "
                      "another version of lingvo_lite, or copied from a job it wrote); training "
                      "resumes from step 4 and neither uses nor deletes it: move it out of "
                      f"{directory} (or delete it) once you no longer need it"], lines
  assert len(about(2)) == 1 and "was recorded by another job" in about(2)[0], lines
  assert about(3)[0].startswith(f"checkpoint step 3 ({directory / '3'}) is damaged: "
                                "_CHECKPOINT_METADATA has "), lines
  assert "does not use it" in about(3)[0]
  assert [line for line in lines if line.startswith("deleting")] == [
      f"deleting checkpoint step {step}: checkpoint.max_to_keep=1" for step in (3, 4, 5)]
  assert _steps(tmp_path) == [1, 2, 6]

  caplog.clear()
  other = Checkpointer(directory, CheckpointSettings(every_steps=1, max_to_keep=1))
  other.save(7, state)
  other.close()
  assert _steps(tmp_path) == [1, 2, 6, 7]
  assert [r.getMessage() for r in caplog.records] == [
      f"checkpoint.max_to_keep=1 keeps steps 1, 2 and 6 in {directory}: not this job's own "
      "(step 1: its lingvo_lite_checksums.json is of record format 1, not 3 (written by another "
      "version of lingvo_lite, or copied from a job it wrote); step 2: its "
      "lingvo_lite_checksums.json was recorded by another job (the folder is a copy); step 6: "
      "its lingvo_lite_checksums.json was recorded by another job (the folder is a copy)), and "
      "retention deletes only the job's own steps: move them out (or delete them) once you no "
      "longer need them"]


def test_a_run_resumed_from_an_unverified_step_takes_over_the_job_of_the_earlier_ones(tmp_path):
  # As a kill between step 2's commit and its checksums leaves it, restored with
  # checkpoint.restore_unverified: the earlier steps' records say whose job it is.
  directory = epath.Path(tmp_path)
  first = Checkpointer(directory, CheckpointSettings(every_steps=1, max_to_keep=None))
  for step in (1, 2):
    first.save(step, {"w": jnp.arange(4.0)})
  first.close()
  (directory / "2" / checkpoint_integrity.CHECKSUMS_FILE).unlink()
  resumed = Checkpointer(directory, CheckpointSettings(every_steps=1, max_to_keep=1,
                                                       restore_unverified=True))
  resumed.clean_up_for_training(2)
  assert resumed.job == first.job
  resumed.save(3, {"w": jnp.arange(4.0)})
  resumed.close()
  assert _steps(tmp_path) == [2, 3]  # Step 1 was the job's own; 2 has no record to say so.
