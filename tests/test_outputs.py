"""Where programs put results (lingvo_lite/outputs.py, output_folders.py): a failed write is
named by its errno, leaves the earlier output whole and nothing of its own behind; nothing the
user made is ever replaced, even when it appears after the check. The programs' own cases
(decode, compile) are in test_bad_input.py, test_decode_program.py and test_compile.py."""

import errno
import io
import os
import sys

import pytest
from etils import epath

from lingvo_lite import output_folders, outputs
from lingvo_lite.decode.records import CompletionWriter
from lingvo_lite.errors import OutputFailure, UsageError, os_error_text
from tests.trained_jobs import tree_digest

FILES = ("manifest.json", "executable.bin")
OWN = '{"schema": "lingvo_lite.compiled_step/1"}'


@pytest.mark.parametrize("code, problem, fix", [
    (errno.EPIPE, "the reader closed the pipe (EPIPE)",
     "keep the reader open until the output ends, or write elsewhere"),
    (errno.ENOSPC, "the disk is full (ENOSPC)", "free space, or write elsewhere"),
    (errno.EROFS, "the file system is read-only (EROFS)",
     "remount it read-write, or write elsewhere"),
    (errno.EACCES, "permission denied (EACCES)",
     "fix the folder's permissions, or write elsewhere"),
    (errno.ETIMEDOUT, "Connection timed out (ETIMEDOUT)", "write elsewhere"),
])
def test_a_failed_write_is_named_by_its_errno(code, problem, fix):
  assert os_error_text(OSError(code, os.strerror(code))) == (problem, fix)


def _step(folder, files):
  folder.mkdir(parents=True, exist_ok=True)
  for name, text in files.items():
    (folder / name).write_text(text)


def _output(path):
  return output_folders.check_folder(epath.Path(path), f"--out={path}", "compiled_step", FILES,
                              "the compiled step")


def _write(text, fail=False):
  def write(folder):
    (folder / "executable.bin").write_text(text)
    if fail:
      raise OSError(errno.ENOSPC, "No space left on device")
    (folder / "manifest.json").write_text(OWN)
  return write


def test_its_own_output_is_replaced_whole_and_a_failed_write_leaves_it_as_it_was(tmp_path):
  step = tmp_path / "step"
  assert output_folders.write_folder(_output(step), _write("first")) is False
  assert output_folders.write_folder(_output(step), _write("second")) is True
  assert (step / "executable.bin").read_text() == "second"
  before = tree_digest(tmp_path)
  with pytest.raises(OSError) as error:
    output_folders.write_folder(_output(step), _write("third", fail=True))
  assert error.value.errno == errno.ENOSPC
  assert tree_digest(tmp_path) == before  # The second step whole; no staging folder left.


def test_a_failed_write_removes_the_folders_it_created(tmp_path):
  with pytest.raises(OSError):
    output_folders.write_folder(_output(tmp_path / "a" / "b" / "step"), _write("x", fail=True))
  assert not os.listdir(tmp_path)


def test_what_the_user_put_there_after_the_check_is_not_replaced(tmp_path):
  step = tmp_path / "step"
  checked = _output(step)  # Missing when checked; the user fills it while the step compiles.
  _step(step, {"manifest.json": OWN, "notes.txt": "mine"})
  before = tree_digest(tmp_path)
  with pytest.raises(UsageError, match="holds notes.txt besides the compiled step lingvo_lite "
                     "wrote"):
    output_folders.write_folder(checked, _write("x"))
  assert tree_digest(tmp_path) == before


def test_an_empty_folder_takes_the_output(tmp_path):
  (tmp_path / "step").mkdir()
  assert output_folders.write_folder(_output(tmp_path / "step"), _write("x")) is False
  assert sorted(os.listdir(tmp_path / "step")) == sorted(FILES)


def test_a_finished_file_never_replaces_one_that_appeared_meanwhile(tmp_path):
  partial, final = tmp_path / "a.jsonl.partial", tmp_path / "a.jsonl"
  partial.write_text("ours")
  final.write_text("theirs")
  with pytest.raises(FileExistsError):
    outputs.publish(epath.Path(partial), epath.Path(final))
  assert final.read_text() == "theirs" and partial.read_text() == "ours"


def test_a_job_without_a_config_still_keeps_outputs_out_of_its_checkpoints(tmp_path):
  (tmp_path / "job" / "checkpoints" / "2").mkdir(parents=True)
  with pytest.raises(UsageError, match="is inside the job's checkpoints folder"):
    outputs.refuse_inside_checkpoints(epath.Path(tmp_path / "job" / "checkpoints" / "2" / "x"),
                                      "--out=x", epath.Path(tmp_path / "job"))
  outputs.refuse_inside_checkpoints(epath.Path(tmp_path / "job" / "checkpoints_old"),
                                    "--out=x", epath.Path(tmp_path / "job"))


def test_a_closed_stdout_is_refused_before_anything_runs(monkeypatch):
  monkeypatch.setattr(sys, "stdout", None)  # What Python makes of a closed descriptor 1.
  with pytest.raises(OutputFailure, match="^--decode_out=-: stdout is closed, so the results "
                     "would be lost"):
    CompletionWriter("-", None, None)


class _FullStream(io.StringIO):
  def write(self, text):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_only_a_failed_print_to_stdout_is_stdouts_failure(monkeypatch):
  """An OSError a print to stdout raised is a StdoutWriteError with its errno; the same errno
  met writing a file is not stdout's, and passes as it was."""
  monkeypatch.setattr(sys, "stdout", _FullStream())
  with pytest.raises(outputs.StdoutWriteError) as raised:
    with outputs.stdout_failures():
      print("results")
  assert raised.value.errno == errno.ENOSPC
  file_error = OSError(errno.ENOSPC, "No space left on device", "results.txt")
  with pytest.raises(OSError) as raised:
    with outputs.stdout_failures():
      raise file_error
  assert raised.value is file_error
  assert isinstance(sys.stdout, _FullStream)  # Given back as it was.


def test_a_summary_lost_to_a_failed_stdout_is_no_failure(monkeypatch):
  """bin/build_store.py and bin/train_vocab.py close with a summary; their results are files,
  so a stdout that fails (`> /dev/full`) costs the summary alone: no traceback, no raise, and
  a store of several splits goes on to the next one."""
  monkeypatch.setattr(sys, "stdout", _FullStream())
  outputs.print_summary("train: built stores/train: 1 documents")
  outputs.print_summary("validation: built stores/validation: 1 documents")
