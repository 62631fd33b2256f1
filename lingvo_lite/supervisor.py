"""A supervising parent for multi-process runs, so a dead peer ends each survivor with one line.

When a process of a jax.distributed run dies, the coordination service aborts the others:
an abort Python cannot catch, after pages of C++ log (with gloo on CPU, a failed collective
comes first). The parent runs the same command as a child, passes stdout through untouched,
copies stderr line by line while watching for that verdict, forwards SIGTERM and SIGINT, and
exits with the child's code, ending with one line that names the missing process. The child
dies with the parent (PR_SET_PDEATHSIG, set by the child itself), so killing the parent never
leaves it behind.

SIGUSR1 (a request for stack dumps, `stack_dumps.py`) is forwarded too, and the parent lives
on: left at its default action it would kill the parent, and the child with it. The child
starts with SIGUSR1 blocked, so one forwarded before it installs its handler waits for it
instead of killing the child.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
from typing import Sequence

from lingvo_lite import distributed

# Set in the child's environment to the supervising parent's pid.
CHILD_ENV = "LINGVO_LITE_SUPERVISOR_PID"
# The coordination service names a dead process (a "task") in one of two forms: inline, or
# as a line of ids after a line that ends with the second pattern.
_MISSING_TASK = re.compile(r"Task (\d+) heartbeat timeout")
_MISSING_TASKS_FOLLOW = re.compile(r"stopped sending heartbeats\):\s*$")
_TASK_IDS_LINE = re.compile(r"^\s*\d+(\s*,\s*\d+)*\s*$")
_PEER_CLOSED = re.compile(r"Gloo.*(Connection closed by peer|Connection reset by peer)")
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
    self.peer_closed = self.peer_closed or bool(_PEER_CLOSED.search(line))

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
      return ("lingvo_lite: error: a peer process closed its connection in the middle of a "
              f"collective (it crashed or was killed), so this one stopped; {fix}")
    return None


def supervise(args: Sequence[str]) -> int:
  """Runs `python -m lingvo_lite ARGS` as a child; returns the exit code to leave with."""
  env = dict(os.environ, **{CHILD_ENV: str(os.getpid())})
  package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
  # Handlers first, so a signal that arrives while the child starts is not lost.
  received: list[int] = []
  child: subprocess.Popen | None = None

  def forward(signum, _):
    if child is None:
      received.append(signum)
    else:
      child.send_signal(signum)
  for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
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
  for raw_line in child.stderr:
    sys.stderr.buffer.write(raw_line)
    sys.stderr.flush()
    watch.feed(raw_line.decode(errors="replace"))
  code = child.wait()
  # Only an abort is JAX stopping a survivor; an exit code is the child's own answer.
  message = watch.verdict() if code < 0 else None
  if message:
    print(message, file=sys.stderr, flush=True)
    return 1
  return code if code >= 0 else 128 - code  # Killed by signal N: the shell's 128 + N.
