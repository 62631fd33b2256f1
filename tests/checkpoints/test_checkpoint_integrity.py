"""A damaged checkpoint is found before it is restored: one line naming the step, the file and
the way out, exit 2, and the job directory left as it was."""

import json
import os
import shutil

from etils import epath

from lingvo_lite.checkpoints import integrity as checkpoint_integrity
from lingvo_lite.testing import run_cli
from tests.trained_jobs import tree_digest

TINY = ["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
        "--fdl.checkpoint.every_steps=2"]


def _largest_file(step_dir):
  files = [os.path.join(d, f) for d, _, names in os.walk(step_dir) for f in names
           if f != checkpoint_integrity.CHECKSUMS_FILE]
  return max(files, key=os.path.getsize)


def _flip_one_byte(path):
  with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0x01]))


def test_checksums_catch_a_flipped_byte_a_truncation_and_a_missing_file(tmp_path):
  step_dir = tmp_path / "7"
  (step_dir / "d").mkdir(parents=True)
  (step_dir / "d" / "data").write_bytes(bytes(range(256)) * 64)
  (step_dir / "meta").write_text("{}")
  checkpoint_integrity.write_checksums(epath.Path(step_dir), 7, "a job")
  recorded = json.loads((step_dir / checkpoint_integrity.CHECKSUMS_FILE).read_text())
  assert recorded["step"] == 7 and sorted(recorded["files"]) == ["d/data", "meta"]
  assert checkpoint_integrity.first_mismatch(epath.Path(step_dir)) is None

  _flip_one_byte(step_dir / "d" / "data")
  assert checkpoint_integrity.first_mismatch(epath.Path(step_dir)) == (
      "d/data does not match the CRC-32 recorded when it was written")
  _flip_one_byte(step_dir / "d" / "data")  # Flipped back: intact again.
  assert checkpoint_integrity.first_mismatch(epath.Path(step_dir)) is None

  (step_dir / "meta").write_text("{")
  assert checkpoint_integrity.first_mismatch(epath.Path(step_dir)) == (
      "meta has 1 bytes, 2 were written")
  (step_dir / "meta").unlink()
  assert checkpoint_integrity.first_mismatch(epath.Path(step_dir)) == "meta is missing"

  (step_dir / checkpoint_integrity.CHECKSUMS_FILE).write_text('{"meta": {"bytes": 2')
  assert checkpoint_integrity.first_mismatch(epath.Path(step_dir)).startswith(
      "lingvo_lite_checksums.json is unreadable (JSONDecodeError: ")


def test_the_record_names_its_step_and_a_record_from_before_that_is_read_as_it_was(tmp_path):
  step_dir = epath.Path(tmp_path) / "57"
  step_dir.mkdir()
  (step_dir / "data").write_bytes(b"x" * 100)
  # As a copy of step 55's folder has it.
  checkpoint_integrity.write_checksums(step_dir, 55, "a job")
  expected = ("lingvo_lite_checksums.json was recorded for step 55 (the folder is a copy or a "
              "rename of step 55's)")
  assert checkpoint_integrity.step_mismatch(step_dir, 57) == f"its {expected}"
  assert checkpoint_integrity.first_mismatch(step_dir) == f"its {expected}"
  assert checkpoint_integrity.step_mismatch(step_dir, 55) is None
  # A record written before records named their step: its files alone are checked (a
  # restore checks the step on the state's step counter).
  record = json.loads((step_dir / checkpoint_integrity.CHECKSUMS_FILE).read_text())
  (step_dir / checkpoint_integrity.CHECKSUMS_FILE).write_text(json.dumps(record["files"]))
  assert checkpoint_integrity.step_mismatch(step_dir, 57) is None
  assert checkpoint_integrity.first_mismatch(step_dir) is None
  (step_dir / "data").write_bytes(b"y" * 100)
  assert checkpoint_integrity.first_mismatch(step_dir) == (
      "data does not match the CRC-32 recorded when it was written")


def test_training_records_checksums_and_refuses_a_corrupt_step(tmp_path):
  job = tmp_path / "job"
  result = run_cli([*TINY, "--fdl.train.steps=4", f"--job_log_dir={job}"])
  assert result.code == 0, result.stderr
  for step in ("2", "4"):
    assert checkpoint_integrity.first_mismatch(epath.Path(job / "checkpoints" / step)) is None

  _flip_one_byte(_largest_file(job / "checkpoints" / "4"))
  before = tree_digest(job)
  for mode_args in (["--fdl.train.steps=6"], ["--mode=eval"]):
    result = run_cli([*TINY, *mode_args, f"--job_log_dir={job}"])
    assert result.code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("lingvo_lite: error: checkpoint step 4 is corrupt: ")
    assert "does not match the CRC-32 recorded when it was written" in lines[0]
    assert lines[0].endswith(f"move {job / 'checkpoints' / '4'} out of the way to resume from "
                             "step 2")
    assert tree_digest(job) == before

  # With checksums off the damage goes unnoticed, as orbax alone would let it (the reason
  # they are on by default).
  result = run_cli([*TINY, "--mode=eval", "--fdl.checkpoint.checksums=False",
                    f"--job_log_dir={job}"])
  assert result.code == 0, result.stderr

  # The way out the message gives works: the run resumes from the intact step.
  shutil.move(job / "checkpoints" / "4", tmp_path / "corrupt_step_4")
  result = run_cli([*TINY, "--fdl.train.steps=6", f"--job_log_dir={job}"])
  assert result.code == 0, result.stderr
  assert "resumed from step 2" in result.stdout


def test_a_crafted_checksums_file_is_a_mismatch_not_a_crash(tmp_path):
  step = epath.Path(tmp_path)
  (step / "data").write_bytes(b"x")
  for record in ({"data": {"bytes": 1e400, "crc32": "0"}}, {"data": {"bytes": "many"}}, [1]):
    (step / checkpoint_integrity.CHECKSUMS_FILE).write_text(json.dumps(record))
    assert "is unreadable" in checkpoint_integrity.first_mismatch(step), record


def test_a_file_that_cannot_be_read_is_a_mismatch_not_a_crash(tmp_path):
  # A folder where the record has a file of the folder's own size: opening it for its CRC-32
  # fails (EISDIR) as a file without read permission does (EACCES, for a user other than
  # root): a reason, named, never an exception out of a restore or a report.
  step_dir = epath.Path(tmp_path) / "3"
  (step_dir / "d").mkdir(parents=True)
  (step_dir / "d" / "data").write_bytes(b"x" * 10)
  checkpoint_integrity.write_checksums(step_dir, 3, "a job")
  (step_dir / "d" / "data").unlink()
  (step_dir / "d" / "data").mkdir()
  record_path = step_dir / checkpoint_integrity.CHECKSUMS_FILE
  record = json.loads(record_path.read_text())
  record["files"]["d/data"]["bytes"] = (step_dir / "d" / "data").stat().length
  record_path.write_text(json.dumps(record))
  assert checkpoint_integrity.first_mismatch(step_dir) == "d/data cannot be read (Is a directory)"
  assert checkpoint_integrity.first_mismatch(step_dir, contents=False) is None  # Sizes alone.


def test_a_record_says_its_form_its_step_and_its_job(tmp_path):
  """`not_own`: a step folder is the job's own only with a record of this version's form,
  for its step, by the job; every other form is still read and its files checked."""
  step_dir = epath.Path(tmp_path) / "4"
  step_dir.mkdir()
  (step_dir / "data").write_bytes(b"x" * 100)
  record_path = step_dir / checkpoint_integrity.CHECKSUMS_FILE
  assert checkpoint_integrity.not_own(step_dir, 4, "a job") == (
      "it has no lingvo_lite_checksums.json")
  checkpoint_integrity.write_checksums(step_dir, 4, "a job")
  record = json.loads(record_path.read_text())
  assert (record["format"], record["step"], record["job"]) == (3, 4, "a job")
  assert checkpoint_integrity.not_own(step_dir, 4, "a job") is None
  assert checkpoint_integrity.recorded_job(step_dir) == "a job"
  assert checkpoint_integrity.not_own(step_dir, 4, "another job") == (
      "its lingvo_lite_checksums.json was recorded by another job (the folder is a copy)")
  assert checkpoint_integrity.not_own(step_dir, 6, "a job").startswith(
      "its lingvo_lite_checksums.json was recorded for step 4 (")
  older = {1: record["files"], 2: {"step": 4, "files": record["files"]}}
  for version, form in older.items():
    record_path.write_text(json.dumps(form))
    assert checkpoint_integrity.read_record(step_dir).format == version
    assert checkpoint_integrity.not_own(step_dir, 4, "a job") == (
        f"its lingvo_lite_checksums.json is of record format {version}, not 3 (written by "
        "another version of lingvo_lite, or copied from a job it wrote)")
    assert checkpoint_integrity.recorded_job(step_dir) is None
    assert checkpoint_integrity.first_mismatch(step_dir) is None
  record_path.write_text("{")
  assert checkpoint_integrity.not_own(step_dir, 4, "a job").startswith(
      "its lingvo_lite_checksums.json is unreadable (JSONDecodeError: ")
