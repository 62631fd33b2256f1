"""A hang-up: the terminal a training run writes to is gone (SIGHUP: the terminal was closed,
the ssh session dropped).

A training run saves and stops on SIGHUP as on SIGTERM (runtime/stop_request.py). Two things
would keep that from working: the run's next write to the terminal fails (EIO on a terminal
that hung up, EPIPE where the output went through a pipe whose reader went with the session)
and raises in the middle of the save; and the line that says what was saved goes to a
terminal nobody reads. So:

- While a run is `surviving_hangups()`, a write to stdout or stderr that fails because the
  terminal is gone sends that stream to /dev/null from then on, instead of raising. EIO is
  always taken so (a terminal that answers EIO is gone); EPIPE only after a hang-up: without
  one, a reader that closed the pipe is the user's doing, and stays an error.
- `record` appends a line to the job's log, `JOB/train.log` (a run stopped by a signal says
  there what it saved), where the user finds it once back.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import socket
import sys
from typing import Iterator

from absl import logging
from etils import epath

from lingvo_lite import file_writes, outputs

LOG_NAME = "train.log"

_hung_up = False


def note_hangup() -> None:
  """Called by the SIGHUP handler: the terminal is gone."""
  global _hung_up
  _hung_up = True


def terminal_gone(error: OSError) -> bool:
  """Whether a write to the terminal failed because it is gone (see the module doc)."""
  # Python runs a pending signal's handler as a function starts: a SIGHUP that came with the
  # failed write (the kernel sends it as the terminal hangs up) has been noted by now.
  return error.errno == errno.EIO or (error.errno == errno.EPIPE and _hung_up)


class _Guarded:
  """A text stream, passed through, that outlives its terminal (see the module doc)."""

  def __init__(self, stream):
    self.stream = stream

  def _call(self, method: str, *args):
    try:
      return getattr(self.stream, method)(*args)
    except OSError as e:
      if not (terminal_gone(e) and outputs.silence(self.stream)):
        raise
      return getattr(self.stream, method)(*args)  # Into /dev/null now.

  def write(self, text):
    return self._call("write", text)

  def flush(self):
    return self._call("flush")

  def __getattr__(self, name):
    return getattr(self.stream, name)


@contextlib.contextmanager
def surviving_hangups() -> Iterator[None]:
  """Within: stdout and stderr outlive their terminal (see the module doc)."""
  saved = sys.stdout, sys.stderr
  sys.stdout, sys.stderr = (None if s is None else _Guarded(s) for s in saved)
  try:
    yield
  finally:
    if isinstance(sys.stdout, _Guarded) and isinstance(sys.stderr, _Guarded):
      sys.stdout, sys.stderr = saved


def record(job_dir: epath.Path, line: str) -> None:
  """Appends `line` to JOB/train.log, with the time, host and pid; a write that fails is a
  warning (what the line reports has happened already)."""
  now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
  path = job_dir / LOG_NAME
  try:
    with file_writes.writing(path), path.open("a") as f:
      f.write(f"{now} {socket.gethostname()} pid {os.getpid()}: {line}\n")
  except OSError as e:
    logging.warning("could not write %s: %s", path, e.strerror or e)
