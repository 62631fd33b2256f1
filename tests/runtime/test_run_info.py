"""JOB/run_info.jsonl: a row per train start, taken back whole when the run fails."""

import errno
import sys

import jax
import pytest
from etils import epath

from lingvo_lite.runtime import run_info, small_disk


def _row(step):
  return run_info.collect(step, jax.devices(), {"data": 1}, 1, "experiments.Some")


def test_a_row_names_the_code_the_host_and_the_devices():
  row = _row(7)
  assert row["start_step"] == 7 and row["experiment"] == "experiments.Some"
  assert row["platform"] == "cpu" and row["device_count"] == len(jax.devices())
  assert row["versions"]["jax"] == jax.__version__ and row["versions"]["python"]
  # This checkout is a git repository (a clean clone in CI; Bazel's runfiles are not).
  if row["git_commit"] is not None:
    assert len(row["git_commit"]) == 40 and isinstance(row["git_dirty"], bool)


def test_the_command_line_is_the_one_given_else_this_process_argv(monkeypatch):
  """The executor passes the command line it parsed (Invocation.command_line), which an
  in-process run (tests, tools) has apart from sys.argv; no module keeps it meanwhile."""
  monkeypatch.setattr(sys, "argv", ["/bin/tool", "--own"])
  given = ["lingvo_lite", "--mode=train", "--fdl.train.steps=3"]
  assert run_info.collect(0, jax.devices(), {}, 1, None, given)["argv"] == given
  assert _row(0)["argv"] == ["/bin/tool", "--own"]
  assert not [name for name in vars(run_info) if "command" in name.lower()]


def test_rollback_restores_the_file_byte_for_byte(tmp_path):
  job = epath.Path(tmp_path)
  first = run_info.RunInfoWriter(job)
  first.append(_row(0))
  first.rollback()
  assert not (job / run_info.FILE_NAME).exists()  # A file it made goes.

  kept = run_info.RunInfoWriter(job)
  kept.append(_row(0))
  kept.commit()
  # A killed run's half row, then a run that fails: the file is as it was.
  with open(job / run_info.FILE_NAME, "a") as f:
    f.write('{"start_step": 5, "ti')
  before = (job / run_info.FILE_NAME).read_bytes()
  failed = run_info.RunInfoWriter(job)
  failed.append(_row(5))
  assert [r["start_step"] for r in run_info.read(job)] == [0, 5]
  failed.rollback()
  assert (job / run_info.FILE_NAME).read_bytes() == before
  assert [r["start_step"] for r in run_info.read(job)] == [0]  # The half row is skipped.


def test_a_disabled_writer_writes_nothing(tmp_path):
  writer = run_info.RunInfoWriter(epath.Path(tmp_path), enabled=False)
  writer.append(_row(0))
  assert not list(tmp_path.iterdir())


def test_on_a_full_disk_a_row_fails_whole_and_a_rollback_needs_no_room(tmp_path):
  disk = small_disk.for_test(tmp_path / "disk", "1m")
  with disk:
    job = epath.Path(disk.path) / "job"
    job.mkdir()
    kept = run_info.RunInfoWriter(job)
    kept.append(_row(0))
    kept.commit()
    before = (job / run_info.FILE_NAME).read_bytes()
    failed = run_info.RunInfoWriter(job)
    failed.append(_row(5))
    disk.fill()
    failed.rollback()  # Cut back in place: writing the old rows again would need room.
    assert (job / run_info.FILE_NAME).read_bytes() == before
    with pytest.raises(OSError) as failure:
      run_info.RunInfoWriter(job).append(_row(5))
    assert failure.value.errno == errno.ENOSPC
    assert failure.value.filename == str(job / run_info.FILE_NAME)
    assert [p.name for p in job.iterdir()] == [run_info.FILE_NAME]  # No temporary.
    assert (job / run_info.FILE_NAME).read_bytes() == before
