"""A hang-up stops a training run as SIGTERM does, and a terminal that is gone never fails it.

The whole story, on a real terminal that closes, with the save, the job's log and the resume:
tests/test_faults.py (section 10). Here, the parts: the signal handling of StopRequest, and the
streams of `hangup.surviving_hangups` on a real pseudo-terminal that hung up and a real pipe.
"""

import errno
import io
import os
import pty
import signal
import sys

import pytest
from etils import epath

from lingvo_lite.runtime import hangup
from lingvo_lite.runtime.stop_request import StopRequest


@pytest.fixture(autouse=True)
def _no_hangup_left():
  yield
  hangup._hung_up = False  # pylint: disable=protected-access


def test_sighup_asks_for_a_stop_and_a_repeated_one_does_not_stop_at_once():
  with StopRequest() as stop:
    assert not stop.should_stop(0)
    os.kill(os.getpid(), signal.SIGHUP)  # Handled before the next line runs.
    assert stop.should_stop(1) and stop.signal_name == "SIGHUP"
    # The shell passes on the terminal's hang-up: the same hang-up, not a second Ctrl-C.
    os.kill(os.getpid(), signal.SIGHUP)
    assert stop.signal_name == "SIGHUP"
  assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL


def test_a_sighup_ignored_when_the_run_starts_stays_ignored():
  previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # As `nohup` starts a command.
  try:
    with StopRequest() as stop:
      assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
      os.kill(os.getpid(), signal.SIGHUP)
      assert not stop.should_stop(1)
  finally:
    signal.signal(signal.SIGHUP, previous)


def _terminal_that_hung_up():
  """A text stream on a pseudo-terminal whose other end is closed: writes answer EIO."""
  terminal, other_end = pty.openpty()
  os.close(terminal)
  return io.TextIOWrapper(io.FileIO(other_end, "w"), line_buffering=True)


def test_writes_to_a_terminal_that_hung_up_go_nowhere_instead_of_failing():
  stream = _terminal_that_hung_up()
  with pytest.raises(OSError) as failure:
    print("unguarded", file=stream)
  assert failure.value.errno == errno.EIO
  saved = sys.stdout
  sys.stdout = stream
  try:
    with hangup.surviving_hangups():
      print("step 1", flush=True)  # EIO: the stream goes to /dev/null, and the run goes on.
      print("step 2", flush=True)
      sys.stdout.flush()
  finally:
    sys.stdout = saved
  print("after", file=stream, flush=True)  # Its descriptor is /dev/null's now.
  stream.close()


def test_a_reader_that_closed_the_pipe_is_an_error_unless_the_terminal_hung_up():
  reader, writer = os.pipe()
  os.close(reader)
  stream = io.TextIOWrapper(io.FileIO(writer, "w"), line_buffering=True)
  saved = sys.stdout
  sys.stdout = stream
  try:
    with hangup.surviving_hangups():
      with pytest.raises(BrokenPipeError):  # `| head` went away: the user's doing.
        print("row", flush=True)
      hangup.note_hangup()  # The reader went with the session.
      print("row", flush=True)
  finally:
    sys.stdout = saved
  stream.close()


def test_the_jobs_log_gets_one_line_per_record(tmp_path):
  hangup.record(epath.Path(tmp_path), "SIGHUP: saved step 7 and stopped")
  hangup.record(epath.Path(tmp_path), "SIGTERM: saved step 9 and stopped")
  lines = (tmp_path / hangup.LOG_NAME).read_text().splitlines()
  assert [line.split(": ", 1)[1] for line in lines] == [
      "SIGHUP: saved step 7 and stopped", "SIGTERM: saved step 9 and stopped"]
  assert all(f" pid {os.getpid()}: " in line for line in lines)
