"""A supervising parent for multi-process runs, so a dead peer ends each survivor with one line.

When a process of a jax.distributed run dies, the coordination service aborts the others:
an abort Python cannot catch, after pages of C++ log (with gloo on CPU, a failed collective
comes first). The parent runs the same command as a child, passes stdout through untouched,
copies stderr line by line while watching for that verdict, forwards SIGTERM, SIGINT and
SIGHUP, and exits with the child's code, ending with one line that names the missing process.
The child dies with the parent (PR_SET_PDEATHSIG, set by the child itself), so killing the
parent never leaves it behind.

A hang-up (SIGHUP: the terminal was closed, the ssh session dropped) reaches the parent, in the
terminal's process group, and not the child, in its own: forwarded, it stops the child as
SIGTERM does (runtime/stop_request.py). The parent lives on to copy the child's stderr to the
end; once the terminal is gone, writing it fails (EIO, or EPIPE through a pipe whose reader
went with the session), and then stderr goes to /dev/null rather than the parent dying and
taking the child, and its save, with it. A SIGHUP ignored at the start (`nohup`) stays ignored.

SIGUSR1 (a request for stack dumps, `stack_dumps.py`) is forwarded too, and the parent lives
on: left at its default action it would kill the parent, and the child with it. The child
starts with SIGUSR1 blocked, so one forwarded before it installs its handler waits for it
instead of killing the child.

The C++ runtime's own log records in the child's stderr (absl's `E1202 12:00:00.000000 42
file.cc:80] ...`, with their continuation lines, a fatal one's stack trace and the Python
stacks faulthandler prints at the abort) are held back
(`RuntimeLog`): when the run ends with a one-line cause (the verdict on a dead peer, or the
child's own `lingvo_lite: error:` line) they are dropped, otherwise printed at the end, so
nothing unexplained is hidden. Python's own output (tracebacks, warnings, logs) passes at once.
`-v`/`--verbosity` passes everything through as it comes.
"""

from __future__ import annotations

import collections
import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from typing import Sequence

import lingvo_lite
from lingvo_lite import outputs
from lingvo_lite.runtime import distributed, hangup

# Set in the child's environment to the supervising parent's pid.
CHILD_ENV = "LINGVO_LITE_SUPERVISOR_PID"
# The coordination service names a dead process (a "task") in one of two forms: inline, or
# as a line of ids after a line that ends with the second pattern.
_MISSING_TASK = re.compile(r"Task (\d+) heartbeat timeout")
_MISSING_TASKS_FOLLOW = re.compile(r"stopped sending heartbeats\):\s*$")
_TASK_IDS_LINE = re.compile(r"^\s*\d+(\s*,\s*\d+)*\s*$")
# The first line of a record of the C++ runtime's log: absl's (`E1202 05:55:27.314021  8637
# coordination_service.cc:1549] ...`) or TensorFlow's older form (`2025-12-02 05:55:27.314021:
# E external/xla/.../client.cc:80] ...`). A Python module's absl log has the same form, but
# names a .py file.
_RUNTIME_RECORD = re.compile(
    r"^(?:[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+\s+|"
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] )\S+\.(?:cc|h|cpp|hpp|c):\d+\] ")
# A fatal record's stack trace: `*** Check failure stack trace: ***`, `    @     0x7fb3...`,
# absl's failure signal handler's `*** SIGABRT received at time=... ***` and `PC: @ ...`; and
# the abort that ends it, seen from Python: faulthandler's `Fatal Python error: Aborted`, with
# every thread's stack as continuation lines.
_RUNTIME_TRACE = re.compile(
    r"^(?:\*\*\* .* \*\*\*\s*$|\s*@\s+0x[0-9a-fA-F]+|PC: @|Fatal Python error: Aborted\s*$)")
# Lines that begin Python's own output, never a runtime record's continuation: a traceback,
# lingvo_lite's lines (`lingvo_lite: error: ...`, a stack dump's `lingvo_lite stack dump:`), a
# Python module's absl log, a warning.
_PYTHON_OUTPUT = re.compile(
    r"^(?:Traceback \(most recent call last\)|lingvo_lite[: ]|jax\.distributed: |"
    r"[IWEF]\d{4} .*\.py:\d+\] |\S+\.py:\d+: \w*Warning)")
# A record's continuation lines come in the same write as its first line; a line later than
# this after the record's last one starts something else.
_CONTINUATION_SECONDS = 0.5
_HELD_LINES = 500  # Of a long run's runtime log, the last lines are kept.
_PR_SET_PDEATHSIG = 1


def wanted(distributed_mode: str, coordinator_address: str | None) -> bool:
  """Whether a process with these (parsed) flags joins a multi-process run and is not
  already the supervised child. The executor asks after absl has parsed the command line,
  so every spelling of the flags, a --flagfile included, counts."""
  if os.environ.get(CHILD_ENV) or distributed_mode == "off":
    return False
  return (coordinator_address is not None or distributed_mode == "on"
          or distributed.detected_cluster() is not None)


def follow_parent() -> None:
  """In a supervised child: die when the parent dies, even if it already has (Linux only;
  elsewhere a killed parent may leave the child running). A no-op when not supervised."""
  parent = os.environ.get(CHILD_ENV)
  if not parent:
    return
  try:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  except (OSError, AttributeError):
    return
  if os.getppid() != int(parent):  # The parent died before prctl took effect.
    os.kill(os.getpid(), signal.SIGKILL)


class LogWatch:
  """What a child's stderr says about dead peers, fed one line at a time."""

  def __init__(self):
    self.missing_processes: set[str] = set()
    self.peer_closed = False
    self._ids_expected = False

  def feed(self, line: str) -> None:
    self.missing_processes.update(_MISSING_TASK.findall(line))
    if self._ids_expected and _TASK_IDS_LINE.match(line):
      self.missing_processes.update(re.findall(r"\d+", line))
    self._ids_expected = bool(_MISSING_TASKS_FOLLOW.search(line))
    self.peer_closed = self.peer_closed or bool(distributed.PEER_CLOSED.search(line))

  def verdict(self) -> str | None:
    """The one line for a child stopped because a peer died, or None if that is not what
    its log says."""
    fix = "restart every process to resume from the last checkpoint"
    if self.missing_processes:
      which = ", ".join(sorted(self.missing_processes, key=int))
      return (f"lingvo_lite: error: process {which} of this jax.distributed run stopped "
              "sending heartbeats (it crashed, was killed or was preempted), so JAX stopped "
              f"this one; {fix}")
    if self.peer_closed:
      return f"lingvo_lite: error: {distributed.PEER_CLOSED_MESSAGE}"
    return None


class RuntimeLog:
  """The C++ runtime's log records in a child's stderr, held back, fed one line at a time."""

  def __init__(self, limit: int = _HELD_LINES):
    self._held: collections.deque[bytes] = collections.deque(maxlen=limit)
    self.left_out = 0
    self._record_at: float | None = None  # When the open record's last line came.

  def holds(self, raw_line: bytes, now: float) -> bool:
    """Whether `raw_line` (arrived at `now`, in seconds) belongs to a runtime record, and is
    held; else it is Python's output, to pass on."""
    line = raw_line.decode(errors="replace")
    continues = (self._record_at is not None and now - self._record_at <= _CONTINUATION_SECONDS
                 and not _PYTHON_OUTPUT.match(line))
    if not (continues or _RUNTIME_RECORD.match(line) or _RUNTIME_TRACE.match(line)):
      self._record_at = None
      return False
    if len(self._held) == self._held.maxlen:
      self.left_out += 1
    self._held.append(raw_line)
    self._record_at = now
    return True

  def release(self) -> bytes:
    """What was held, as text to print, with a header line; empty when nothing was."""
    if not self._held:
      return b""
    skipped = f", its first {self.left_out} lines left out" if self.left_out else ""
    lines = b"".join(self._held)
    self._held.clear()
    header = f"lingvo_lite: the JAX runtime's log (held back while the run went on{skipped}):\n"
    return header.encode() + lines + (b"" if lines.endswith(b"\n") else b"\n")


def _write_stderr(data: bytes) -> None:
  """Writes `data` to stderr; once the terminal is gone (runtime/hangup.py), into /dev/null."""
  try:
    sys.stderr.buffer.write(data)
    sys.stderr.flush()
  except OSError as e:
    if not (hangup.terminal_gone(e) and outputs.silence(sys.stderr)):
      raise
    sys.stderr.buffer.write(data)
    sys.stderr.flush()


def supervise(args: Sequence[str], quiet_runtime_log: bool = True) -> int:
  """Runs `python -m lingvo_lite ARGS` as a child; returns the exit code to leave with.

  Args:
    args: The command line, without the program.
    quiet_runtime_log: Hold back the C++ runtime's log (see the module doc); False passes
      every line through as it comes.
  """
  env = dict(os.environ, **{CHILD_ENV: str(os.getpid())})
  package_root = os.path.dirname(os.path.dirname(os.path.abspath(lingvo_lite.__file__)))
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
  # Handlers first, so a signal that arrives while the child starts is not lost.
  received: list[int] = []
  child: subprocess.Popen | None = None

  def forward(signum, _):
    if signum == signal.SIGHUP:
      hangup.note_hangup()
    if child is None:
      received.append(signum)
    else:
      child.send_signal(signum)
  forwarded = [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1]
  if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # Ignored under `nohup`: it stays so.
    forwarded.append(signal.SIGHUP)
  for signum in forwarded:
    signal.signal(signum, forward)
  # Its own process group: a Ctrl-C at the terminal reaches the child once, forwarded from
  # here, not twice (a second SIGINT stops a training run at once, without saving). The
  # child inherits the blocked SIGUSR1 (a signal mask survives exec); a SIGUSR1 to this
  # process meanwhile waits, and is forwarded once the mask is restored.
  # (`python -m lingvo_lite` blocks it from its first line already: see __main__.py.) Then
  # unblocked here, where `forward` handles it.
  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
  try:
    child = subprocess.Popen([sys.executable, "-m", "lingvo_lite", *args], env=env,
                             stderr=subprocess.PIPE, process_group=0)
  finally:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
  for signum in received:
    child.send_signal(signum)
  watch = LogWatch()
  runtime_log = RuntimeLog() if quiet_runtime_log else None
  last_line = b""
  for raw_line in child.stderr:
    watch.feed(raw_line.decode(errors="replace"))
    if runtime_log is not None and runtime_log.holds(raw_line, time.monotonic()):
      continue
    _write_stderr(raw_line)
    last_line = raw_line if raw_line.strip() else last_line
  code = child.wait()
  # Only an abort is JAX stopping a survivor; an exit code is the child's own answer.
  message = watch.verdict() if code < 0 else None
  # A run that ended with its cause in one line needs no runtime log; any other shows it.
  if runtime_log is not None and not (message or last_line.startswith(b"lingvo_lite: error:")):
    _write_stderr(runtime_log.release())
  if message:
    _write_stderr(f"{message}\n".encode())
    return 1
  return code if code >= 0 else 128 - code  # Killed by signal N: the shell's 128 + N.
