"""Metric files across a resume and a failure: one JSONL row (and one TensorBoard value) per
step, and after any failure exactly the rows up to the last commit (a killed run's rows past
the step a run resumes from go when it starts, in place)."""

import errno
import json
import os

import pytest
from etils import epath

from lingvo_lite.runtime import event_files, small_disk, summaries
from tests.trained_jobs import tree_digest


def _rows(path):
  return [json.loads(line) for line in path.read_text().splitlines()]


def _writer(job, resumed_from=None, tensorboard=True, name="train"):
  return summaries.MetricsWriter(
      job / ("metrics.jsonl" if name == "train" else f"{name}_metrics.jsonl"),
      job / "summaries" / name if tensorboard else None, resumed_from=resumed_from)


def _killed_run(job, steps, tensorboard=True):
  """What a run killed after its checkpoint at steps[1] leaves: rows past that step too."""
  writer = _writer(job, tensorboard=tensorboard)
  for step in steps:
    writer.write(step, {"loss": 1.0})
  writer.close()
  # Named as a run that started earlier (TensorBoard reads a folder's files in name order;
  # within one second, this process's serial numbers would decide).
  for path in (job / "summaries" / "train").iterdir() if tensorboard else ():
    stamp, rest = path.name.removeprefix("events.out.tfevents.").split(".", 1)
    path.rename(path.parent / f"events.out.tfevents.{int(stamp) - 100:010d}.{rest}")


def _scalars(folder):
  """(step, value) of the `loss` series, as TensorBoard's standard scalar reader reads the
  folder (scalars stored as tensors, as TensorFlow's summary ops write them, are not seen)."""
  # pylint: disable=g-import-not-at-top
  from tensorboard.backend.event_processing import event_accumulator
  accumulator = event_accumulator.EventAccumulator(str(folder), {"scalars": 0})
  accumulator.Reload()
  return [(e.step, e.value) for e in accumulator.Scalars("loss")]


def test_the_tensorboard_writer_opens_at_the_first_write(tmp_path):
  job = epath.Path(tmp_path) / "job"
  job.mkdir()
  writer = _writer(job, resumed_from=0)
  writer.close()
  assert not list(job.iterdir())
  writer.rollback()
  assert not list(job.iterdir())


def test_a_resumed_run_starts_by_dropping_the_rows_past_its_step(tmp_path):
  job = epath.Path(tmp_path)
  _killed_run(job, [10, 20, 30, 40, 50], tensorboard=False)
  writer = _writer(job, resumed_from=20, tensorboard=False)
  # No checkpoint covers the killed run's rows past step 20: gone before this run's first.
  assert [r["step"] for r in _rows(job / "metrics.jsonl")] == [10, 20]
  writer.write(30, {"loss": 2.0})
  writer.write(40, {"loss": 2.0})
  # Live: the user watching the file sees the new rows at once, one per step.
  assert [(r["step"], r["loss"]) for r in _rows(job / "metrics.jsonl")] == [
      (10, 1.0), (20, 1.0), (30, 2.0), (40, 2.0)]
  writer.commit()
  writer.write(50, {"loss": 2.0})
  writer.commit()
  writer.close()
  assert [r["step"] for r in _rows(job / "metrics.jsonl")] == [10, 20, 30, 40, 50]
  assert not [p.name for p in job.iterdir() if p.name.startswith(".")]


def test_a_row_of_the_restored_step_written_again_supersedes_the_old_one(tmp_path):
  # A finished job rerun evaluates its last step again.
  job = epath.Path(tmp_path)
  _killed_run(job, [10, 20])
  writer = _writer(job, resumed_from=20)
  writer.write(20, {"loss": 3.0})
  writer.commit()
  writer.close()
  assert [(r["step"], r["loss"]) for r in _rows(job / "metrics.jsonl")] == [
      (10, 1.0), (20, 3.0)]
  assert _scalars(job / "summaries" / "train") == [(10, 1.0), (20, 3.0)]


def test_a_torn_last_row_goes_with_the_rows_past_the_resumed_step(tmp_path):
  job = epath.Path(tmp_path)
  (job / "metrics.jsonl").write_bytes(b'{"step": 10, "loss": 1.0}\n{"step": 20, "lo')
  writer = _writer(job, resumed_from=10, tensorboard=False)
  writer.write(20, {"loss": 2.0})
  assert (job / "metrics.jsonl").read_text().splitlines() == [
      '{"step": 10, "loss": 1.0}', '{"step": 20, "loss": 2.0}']
  writer.rollback()
  assert (job / "metrics.jsonl").read_bytes() == b'{"step": 10, "loss": 1.0}\n'


def test_a_failed_resume_leaves_exactly_the_rows_up_to_its_step(tmp_path):
  job = epath.Path(tmp_path) / "job"
  _killed_run(job, [10, 20, 30])
  train, evaluation = _writer(job, resumed_from=20), _writer(job, resumed_from=20, name="eval")
  train.write(30, {"loss": 2.0})
  evaluation.write(30, {"loss": 2.0})
  train.rollback()
  evaluation.rollback()
  assert [(r["step"], r["loss"]) for r in _rows(job / "metrics.jsonl")] == [(10, 1.0), (20, 1.0)]
  assert not (job / "eval_metrics.jsonl").exists()  # The killed run wrote no eval rows.
  assert _scalars(job / "summaries" / "train") == [(10, 1.0), (20, 1.0)]
  assert not (job / "summaries" / "eval").exists()
  # A resume of a job with no rows past its step leaves it byte for byte as it was.
  before = tree_digest(job)
  train = _writer(job, resumed_from=20)
  train.write(30, {"loss": 2.0})
  train.rollback()
  assert tree_digest(job) == before


def test_a_failed_first_run_leaves_no_files_or_folders(tmp_path):
  job = epath.Path(tmp_path) / "job"
  job.mkdir()
  train, evaluation = _writer(job, resumed_from=0), _writer(job, resumed_from=0, name="eval")
  train.write(10, {"loss": 2.0})
  evaluation.write(10, {"loss": 2.0})
  train.rollback()
  evaluation.rollback()
  assert not list(job.iterdir())


def test_a_resumed_run_starts_by_dropping_a_killed_runs_events_past_its_step(tmp_path):
  job = epath.Path(tmp_path)
  _killed_run(job, [10, 20, 30, 40, 50])
  events = list((job / "summaries" / "train").iterdir())
  writer = _writer(job, resumed_from=20)
  assert _scalars(job / "summaries" / "train") == [(10, 1.0), (20, 1.0)]
  writer.write(30, {"loss": 2.0})
  writer.write(40, {"loss": 2.0})
  writer.close()
  # No zigzag of the killed run's values and this run's, in any of TensorBoard's loaders.
  assert _scalars(job / "summaries" / "train") == [(10, 1.0), (20, 1.0), (30, 2.0), (40, 2.0)]
  writer.commit()
  assert _scalars(job / "summaries" / "train") == [(10, 1.0), (20, 1.0), (30, 2.0), (40, 2.0)]
  assert all(path.exists() for path in events)


def test_a_disabled_writer_writes_nothing(tmp_path):
  job = epath.Path(tmp_path)
  writer = summaries.MetricsWriter(job / "metrics.jsonl", job / "summaries", enabled=False,
                                   resumed_from=0)
  writer.write(1, {"loss": 1.0})
  writer.commit()
  writer.rollback()
  assert not list(job.iterdir())


def test_values_past_float32_reach_tensorboard_as_inf_and_the_rows_as_they_are(tmp_path):
  # A diverged model's eval perplexity (exp of a loss of 700) is past float32's range, which
  # TensorFlow refuses to round: the run once died writing it.
  job = epath.Path(tmp_path)
  writer = _writer(job)
  writer.write(3, {"loss": 1e304})
  writer.close()
  assert _rows(job / "metrics.jsonl") == [{"step": 3, "loss": 1e304}]
  assert _scalars(job / "summaries" / "train") == [(3, float("inf"))]


def test_train_and_every_eval_set_are_scalars_tensorboard_lists(tmp_path):
  """TensorBoard's standard scalar reader (`EventAccumulator.Scalars`, what its scalar
  dashboard reads) lists every metric of the train writer and of each eval set's."""
  from lingvo_lite.on_mesh import evaluation  # pylint: disable=g-import-not-at-top
  job = epath.Path(tmp_path)
  train = _writer(job)
  train.write(10, {"loss": 2.5, "learning_rate": 1e-3})
  train.close()
  sets = evaluation.SetWriters(job, ["validation", "held_out"], enabled=True,
                               resumed_from=None)
  sets.write(10, {"validation": {"loss": 3.0, "bits_per_byte": 1.5},
                  "held_out": {"loss": 4.0, "bits_per_byte": 2.0}})
  sets.close()
  assert _scalars(job / "summaries" / "train") == [(10, 2.5)]
  for name, loss in (("validation", 3.0), ("held_out", 4.0)):
    assert _scalars(job / "summaries" / f"eval_{name}") == [(10, loss)]


def test_event_records_carry_tensorboards_checksums():
  """The TFRecord framing against TensorBoard's own CRC-32C (its TensorFlow stub's)."""
  # pylint: disable-next=g-import-not-at-top
  from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
  for data in (b"", b"123456789", bytes(range(256)) * 5):
    record = event_files.tfrecord(data)
    assert record[12:-4] == data and int.from_bytes(record[:8], "little") == len(data)
    assert int.from_bytes(record[8:12], "little") == masked_crc32c(record[:8])
    assert int.from_bytes(record[-4:], "little") == masked_crc32c(data)


def test_rows_up_to_a_committed_step_outlast_a_failure_and_the_later_ones_go(tmp_path):
  # The train program commits a step when its checkpoint is verified: rows written meanwhile
  # (step 3) and after (step 4) go with a failure; a new job's rows of step 2 stay.
  job = epath.Path(tmp_path) / "job"
  writer = _writer(job)
  for step in (1, 2, 3):
    writer.write(step, {"loss": float(step)})
  writer.commit(2)
  writer.write(4, {"loss": 4.0})
  writer.rollback()
  assert [(r["step"], r["loss"]) for r in _rows(job / "metrics.jsonl")] == [(1, 1.0), (2, 2.0)]
  assert _scalars(job / "summaries" / "train") == [(1, 1.0), (2, 2.0)]


def test_a_resumed_runs_rows_up_to_its_commit_stay_and_the_later_ones_go(tmp_path):
  job = epath.Path(tmp_path)
  _killed_run(job, [10, 20, 30, 40])
  writer = _writer(job, resumed_from=20)
  writer.write(30, {"loss": 2.0})
  writer.write(40, {"loss": 2.0})
  writer.commit(30)  # Also drops the killed run's rows past step 20.
  writer.write(50, {"loss": 2.0})
  writer.rollback()
  assert [(r["step"], r["loss"]) for r in _rows(job / "metrics.jsonl")] == [
      (10, 1.0), (20, 1.0), (30, 2.0)]
  assert _scalars(job / "summaries" / "train") == [(10, 1.0), (20, 1.0), (30, 2.0)]
  assert not [p.name for p in job.iterdir() if p.name.startswith(".")]


@pytest.fixture
def full_disk(tmp_path):
  disk = small_disk.for_test(tmp_path / "disk", "1m")
  with disk:
    yield disk


def test_on_a_full_disk_a_resumed_run_cuts_the_killed_runs_rows_in_place(full_disk):
  job = epath.Path(full_disk.path) / "job"
  _killed_run(job, [10, 20, 30])
  full_disk.fill()
  writer = _writer(job, resumed_from=20)  # Dropping the last rows needs no room.
  assert [r["step"] for r in _rows(job / "metrics.jsonl")] == [10, 20]
  assert _scalars(job / "summaries" / "train") == [(10, 1.0), (20, 1.0)]
  with pytest.raises(OSError) as failure:
    writer.write(30, {"loss": 2.0})  # Its event file's first page.
  assert failure.value.errno == errno.ENOSPC
  writer.rollback()
  assert [r["step"] for r in _rows(job / "metrics.jsonl")] == [10, 20]
  assert _scalars(job / "summaries" / "train") == [(10, 1.0), (20, 1.0)]
  assert not [name for _, _, names in os.walk(job) for name in names if ".tmp" in name]


def test_on_a_full_disk_a_failed_replacement_keeps_the_steps_old_row(full_disk):
  # A finished job rerun evaluates its last step again; the rewrite that replaces its row
  # needs room for a new copy of the file.
  job = epath.Path(full_disk.path) / "job"
  _killed_run(job, [10, 20])
  writer = _writer(job, resumed_from=20)
  writer.write(20, {"loss": 3.0})
  full_disk.fill()
  with pytest.raises(OSError) as failure:
    writer.commit(20)
  assert failure.value.errno == errno.ENOSPC
  assert failure.value.filename == str(job / "metrics.jsonl")  # Not its temporary's.
  writer.rollback()
  assert [(r["step"], r["loss"]) for r in _rows(job / "metrics.jsonl")] == [
      (10, 1.0), (20, 1.0)]
  assert _scalars(job / "summaries" / "train") == [(10, 1.0), (20, 1.0)]
  assert not [name for _, _, names in os.walk(job) for name in names if ".tmp" in name]
