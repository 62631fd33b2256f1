"""Which checkpoint step a reading program uses (checkpoints/selection.py): the one asked for if
it is usable, else the latest usable one, and one line naming the fix when there is none.
Real step folders written by Checkpointer, one made unusable by removing its checksums as a
kill between the commit and the checksums leaves it."""

import shutil

import jax.numpy as jnp
import pytest
from etils import epath

from lingvo_lite.checkpoints import integrity as checkpoint_integrity, selection
from lingvo_lite.checkpoints.manager import CheckpointSettings, Checkpointer
from lingvo_lite.errors import UsageError

SHOWN = epath.Path("runs/job")  # The job dir as a user wrote it.


def _job(tmp_path, steps=(2, 4), unverified=()):
  """JOB/checkpoints with verified `steps`, and `unverified` copies of the first without
  checksums; returns the folder."""
  folder = tmp_path / "checkpoints"
  writer = Checkpointer(epath.Path(folder), CheckpointSettings(every_steps=1, max_to_keep=None))
  for step in steps:
    writer.save(step, {"w": jnp.full(3, float(step))}, force=True)
  writer.close()
  for step in unverified:
    shutil.copytree(folder / str(steps[0]), folder / str(step))
    (folder / str(step) / checkpoint_integrity.CHECKSUMS_FILE).unlink()
  return epath.Path(folder)


def _choose(folder, wanted):
  return selection.chosen_step(selection.open_existing(folder, CheckpointSettings()), folder,
                               wanted, SHOWN)


def _refused(folder, wanted):
  with pytest.raises(UsageError) as error:
    _choose(folder, wanted)
  assert "\n" not in str(error.value)
  return str(error.value)


def test_the_latest_usable_step_or_the_one_asked_for(tmp_path):
  folder = _job(tmp_path, unverified=(6,))
  assert _choose(folder, None) == 4  # 6 has no checksums: skipped.
  assert _choose(folder, 2) == 2


def test_a_step_that_is_not_there_lists_the_usable_ones(tmp_path):
  folder = _job(tmp_path, unverified=(6,))
  assert _refused(folder, 3) == (f"--checkpoint_step=3: no such checkpoint in {folder}; its "
                                 "steps: 2, 4")
  assert _refused(folder, 6).startswith("--checkpoint_step=6: checkpoint step 6 has no "
                                        "checksums (")


def test_no_folder_and_no_usable_step_are_each_one_line_with_the_way_out(tmp_path):
  missing = epath.Path(tmp_path / "checkpoints")
  assert selection.open_existing(missing, CheckpointSettings()) is None
  assert not missing.exists()  # A reading program never creates the folder.
  assert _refused(missing, None) == (f"--job_log_dir={SHOWN}: no checkpoint in {missing}; "
                                     "train first (--mode=train)")
  folder = _job(tmp_path / "other", steps=(2,), unverified=(5,))
  (folder / "2" / checkpoint_integrity.CHECKSUMS_FILE).unlink()
  message = _refused(folder, None)
  assert message.startswith(f"--job_log_dir={SHOWN}: no usable checkpoint in {folder}: step 2 "
                            "has no checksums (")
  assert message.endswith("; fix the step folder or move it away, or train again "
                          "(--mode=train moves unusable steps aside and starts over)")


def test_a_negative_step_is_refused_before_anything_is_read():
  selection.check_wanted(None)
  selection.check_wanted(0)
  with pytest.raises(UsageError, match=r"^--checkpoint_step=-1: must be a step number >= 0$"):
    selection.check_wanted(-1)
