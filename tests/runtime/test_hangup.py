"""A hang-up stops a training run as SIGTERM does, and a terminal that is gone never fails it.

The whole story, on a real terminal that closes, with the save, the job's log and the resume:
tests/test_faults.py (section 10). Here, the parts: the signal handling of StopRequest, the
streams of `hangup.surviving_hangups` on a real pseudo-terminal that hung up and a real pipe,
and a multi-process run's supervising parent on a terminal that closes.
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
from lingvo_lite.testing import Terminal, source_root

# The supervising parent (runtime/supervisor.py), its child `python -m lingvo_lite ARGS`
# replaced by the script argv[1]: the parent's part alone, without a training run's minutes.
_PARENT = """
import subprocess, sys
from lingvo_lite.runtime import supervisor
popen = subprocess.Popen
subprocess.Popen = lambda argv, **kwargs: popen([sys.executable, "-c", sys.argv[1]], **kwargs)
sys.exit(supervisor.supervise([]))
"""
# A child that waits for SIGHUP (as a run's StopRequest does), then writes on to stderr, which
# the parent copies to the terminal that is gone, and reports what it got in the file argv[1].
_CHILD = """
import signal, sys, time
got = []
signal.signal(signal.SIGHUP, lambda signum, frame: got.append(signum))
print("child: ready", file=sys.stderr, flush=True)
deadline = time.time() + 60
while not got and time.time() < deadline:
  time.sleep(0.01)
for line in range(200):
  print(f"child: saving, line {line}", file=sys.stderr, flush=True)
with open(REPORT, "w") as f:
  f.write(" ".join(signal.Signals(signum).name for signum in got))
sys.exit(0 if got else 3)
"""


@pytest.fixture(autouse=True)
def _no_hangup_left():
  yield
  hangup._hung_up = False  # pylint: disable=protected-access


def test_sighup_asks_for_a_stop_and_what_follows_a_hang_up_does_not_stop_at_once():
  previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)  # Were these tests run by `nohup`.
  try:
    _stop_on_sighup()
  finally:
    signal.signal(signal.SIGHUP, previous)


def _stop_on_sighup():
  with StopRequest() as stop:
    assert not stop.should_stop(0)
    os.kill(os.getpid(), signal.SIGHUP)  # Handled before the next line runs.
    assert stop.should_stop(1) and stop.signal_name == "SIGHUP"
    # The shell passes on the terminal's hang-up, and the system may end the session with a
    # SIGTERM: the same stop, not a second Ctrl-C (which would exit at once, 130).
    os.kill(os.getpid(), signal.SIGHUP)
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.signal_name == "SIGHUP"
  assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL  # As it was.


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


def test_the_supervising_parent_passes_a_hang_up_on_and_outlives_its_terminal(tmp_path):
  report = tmp_path / "child.txt"
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
      str(source_root()), os.environ.get("PYTHONPATH")])))
  child = _CHILD.replace("REPORT", repr(str(report)))
  with Terminal(["-c", _PARENT, child], cwd=tmp_path, env=env) as terminal:
    terminal.wait_for(b"child: ready")
    code = terminal.hang_up()  # The parent gets SIGHUP: its child, in a group of its own, not.
  # Passed on once, and the child's 200 lines after it copied to a terminal that is gone
  # (EIO) without killing the parent, which exits with the child's code.
  assert report.read_text() == "SIGHUP"
  assert code == 0, terminal.shown.decode(errors="replace")[-2000:]
