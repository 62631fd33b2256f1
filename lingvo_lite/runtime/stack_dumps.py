"""Stack dumps: every thread's stack of this process, written to a file, for a job that hangs.

A dump is one file `FOLDER/<host>-<pid>-<UTC time>.txt` (`JOB/stacks/` once the executor
has resolved the job dir, in every mode): a header (why, host, pid, the jax.distributed
process index), each Python thread's stack from `sys._current_frames()`, and, where `py-spy`
is installed, its `py-spy dump --native` view, which shows the C and C++ frames (XLA, gloo, a
blocked collective) below the Python ones.

`kill -USR1 PID` writes one on demand (`install_signal_handler`). A Python-level signal
handler would be useless exactly then: it runs only in the main thread, between bytecodes,
and a hung main thread is waiting inside C++. So `faulthandler`, whose handler is C, writes
every thread's stack into a pipe at signal time, and a daemon thread that reads the pipe
writes the dump, with faulthandler's text as one more section (the only view of a thread
whose frames change before the reader thread gets to them). Until a folder is known (the job
dir is not resolved yet, or the mode has none), a dump goes to stderr instead of a file.
"""

from __future__ import annotations

import atexit
import datetime
import faulthandler
import fcntl
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

from etils import epath

# py-spy pauses the process while it reads it; a stuck ptrace must not hold the dump back long.
PY_SPY_TIMEOUT_SECONDS = 20.0
_PIPE_BYTES = 1 << 20  # faulthandler's text of hundreds of threads fits; F_SETPIPE_SZ may refuse.
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux's value; Python < 3.10 lacks it.
# After the first bytes of a signal's text, the rest arrives within this (faulthandler writes it
# in one go); signals closer together than this share one dump.
_SETTLE_SECONDS = 0.2

_lock = threading.Lock()  # One dump at a time, so names stay unique and sections whole.
_last_base: str | None = None
_same_base_count = 0
_folder: epath.Path | None = None
_installed_in_pid: int | None = None
_dumping = threading.Event()  # The reader thread is writing a signal's dump.


def set_folder(folder: epath.Path | str | None) -> None:
  """Where SIGUSR1's dumps go from now on; None: stderr."""
  global _folder
  _folder = None if folder is None else epath.Path(folder)


def folder() -> epath.Path | None:
  return _folder


# ----------------------------------------------------------------------------- the text


def _process_index() -> str | None:
  """"I of N" when jax.distributed is up; jax is not imported for it (nor asked
  anything that could start a backend: the process may be hung inside one)."""
  module = sys.modules.get("jax._src.distributed")
  state = getattr(module, "global_state", None)
  if state is None or getattr(state, "client", None) is None:
    return None
  return f"{state.process_id} of {state.num_processes} (jax.distributed)"


def _utc_now() -> datetime.datetime:
  return datetime.datetime.now(datetime.timezone.utc)


def _stamp(now: datetime.datetime) -> str:
  return now.strftime("%Y%m%dT%H%M%S.") + f"{now.microsecond // 1000:03d}Z"


def _host() -> str:
  # A host name is a file name here: anything but letters, digits, '.', '_' and '-' goes.
  return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:64] or "host"


def python_stacks() -> str:
  """Every thread's Python stack, most recent call last, the dumping thread included."""
  threads = {thread.ident: thread for thread in threading.enumerate()}
  sections = []
  for ident, frame in sorted(sys._current_frames().items(),  # pylint: disable=protected-access
                             key=lambda item: item[0] != threading.main_thread().ident):
    thread = threads.get(ident)
    if thread is None:  # A thread started outside `threading` (by C++) that runs Python now.
      title = f"Thread (not started by threading) ident {ident}"
    else:
      flags = ["daemon" if thread.daemon else "not daemon"]
      if thread is threading.main_thread():
        flags.append("main thread")
      if ident == threading.get_ident():
        flags.append("this thread, writing the dump")
      native = f", native id {thread.native_id}" if thread.native_id is not None else ""
      title = f"Thread {thread.name!r} ident {ident}{native} ({', '.join(flags)})"
    sections.append(title + ":\n" + "".join(traceback.format_stack(frame)))
  return "\n".join(sections)


def _py_spy() -> str | None:
  """The py-spy executable: on PATH, or beside this Python (a virtual environment's bin/)."""
  beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
  return shutil.which("py-spy") or (beside if os.access(beside, os.X_OK) else None)


def native_stacks(timeout: float = PY_SPY_TIMEOUT_SECONDS) -> str:
  """`py-spy dump --native` of this process, or why there is none.

  py-spy's native unwinder fails on some busy processes ("Failed to merge native and python
  frames", libunwind errors) where its Python-only view works: that view is taken then."""
  executable = _py_spy()
  if executable is None:
    return ("py-spy is not installed (pip install py-spy), so no native frames; the Python "
            "stacks above are complete for Python code\n")
  failures = []
  for native in (True, False):
    command = [executable, "dump", *(["--native"] if native else []), "--pid", str(os.getpid())]
    shown = " ".join(command)
    try:
      done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                            stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
      failures.append(f"{shown} did not finish in {timeout:g} s")
      break  # A stuck ptrace: a second try would wait as long.
    except OSError as e:
      failures.append(f"{shown} could not start: {e}")
      break
    if done.returncode == 0:
      return "".join(f"{failure}\n" for failure in failures) + done.stdout
    failures.append(f"{shown} failed (exit code {done.returncode}): {done.stderr.strip()}")
  said = "\n".join(failures)
  if "ptrace" in said.lower() or "permission" in said.lower():
    said += ("\n(ptrace is not permitted here: a container without CAP_SYS_PTRACE, or "
             "kernel.yama.ptrace_scope above 0 for a non-root user)")
  return said + "\n"


def text(reason: str, faulthandler_text: str | None = None,
         now: datetime.datetime | None = None) -> str:
  """The whole dump: header, Python stacks, faulthandler's text if given, native stacks."""
  now = now or _utc_now()
  header = [f"lingvo_lite stack dump: {reason}",
            f"host: {socket.gethostname()}", f"pid: {os.getpid()}",
            f"time: {now.isoformat(timespec='milliseconds').replace('+00:00', 'Z')}",
            f"command: {' '.join(sys.argv)}"]
  index = _process_index()
  if index:
    header.insert(3, f"process: {index}")
  parts = ["\n".join(header) + "\n",
           "== Python stacks of every thread (sys._current_frames; most recent call last) ==\n"
           + python_stacks()]
  if faulthandler_text is not None:
    parts.append("== faulthandler, written in C when the signal arrived (most recent call "
                 "first) ==\n" + faulthandler_text)
  parts.append("== Native stacks (py-spy dump --native; most recent call first) ==\n"
               + native_stacks())
  return "\n".join(parts)


# ----------------------------------------------------------------------------- the file


def _unique_name(now: datetime.datetime) -> str:
  """`<host>-<pid>-<UTC time>.txt`, never the same twice in this process (call under _lock):
  a second dump within the same millisecond gets `-2`, and so on."""
  global _last_base, _same_base_count
  base = f"{_host()}-{os.getpid()}-{_stamp(now)}"
  _same_base_count = _same_base_count + 1 if base == _last_base else 1
  _last_base = base
  return (base if _same_base_count == 1 else f"{base}-{_same_base_count}") + ".txt"


def dump(folder: epath.Path | str, reason: str, faulthandler_text: str | None = None) -> str:
  """Writes one dump into `folder` (created if missing); returns the file's path.

  Raises:
    OSError (or the remote file system's error): the folder cannot be written.
  """
  now = _utc_now()  # When the stacks were taken, in the header and the name.
  return _write(epath.Path(folder), text(reason, faulthandler_text, now), now)


def _write(folder: epath.Path, content: str, now: datetime.datetime) -> str:
  """Through a temporary name and a rename, so a reader never sees half a dump."""
  with _lock:
    name = _unique_name(now)
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f".{name}.tmp"
    temporary.write_text(content, encoding="utf-8")
    temporary.rename(folder / name)
  return str(folder / name)


def dump_or_print(folder: epath.Path | str | None, reason: str,
                  faulthandler_text: str | None = None) -> str:
  """A dump into `folder`, or onto stderr when there is none or it cannot be written;
  returns where it went, for the caller's one line."""
  now = _utc_now()
  content = text(reason, faulthandler_text, now)
  problem = " (no job folder known)"
  if folder is not None:
    try:
      return _write(epath.Path(folder), content, now)
    except Exception as e:  # pylint: disable=broad-except
      # Any file system's error: a dump that cannot be filed is still shown.
      problem = f" ({folder} could not be written: {type(e).__name__}: {e})"
  with _lock:
    print(content, file=sys.stderr, flush=True)
  return "stderr" + problem


def warn(message: str) -> None:
  print(f"lingvo_lite: warning: {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- SIGUSR1


def install_signal_handler() -> None:
  """SIGUSR1 writes a dump into `folder()` (see `set_folder`) and one warning line.

  Works while the main thread is blocked in C: faulthandler's C handler writes into a pipe,
  and a daemon thread (which keeps SIGUSR1 blocked, so the handler never has to run in the
  thread that drains the pipe) writes the dump. Idempotent in a process; installs afresh in a
  forked child, whose reader thread did not survive the fork. Unblocks SIGUSR1 in the calling
  thread: the supervisor starts its child with it blocked, so that a signal forwarded before
  this point waits here instead of killing the child (its default action).
  """
  global _installed_in_pid
  if _installed_in_pid == os.getpid():
    return
  read_end, write_end = os.pipe()
  try:
    fcntl.fcntl(write_end, _F_SETPIPE_SZ, _PIPE_BYTES)
  except OSError:
    pass  # Above /proc/sys/fs/pipe-max-size for this user: the default 64 KiB then.
  # A full pipe (a stuck reader) drops the text rather than block the signalled thread.
  os.set_blocking(write_end, False)
  # Blocked before the reader starts, which inherits the mask; unblocked here after.
  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
  threading.Thread(target=_drain, args=(read_end,), name="lingvo_lite-stack-dumps",
                   daemon=True).start()
  faulthandler.register(signal.SIGUSR1, file=write_end, all_threads=True, chain=False)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
  _installed_in_pid = os.getpid()
  atexit.register(_finish_pending_dump, read_end)


def _finish_pending_dump(read_end: int, timeout: float = 2 * PY_SPY_TIMEOUT_SECONDS) -> None:
  """At exit: a signal's dump still unread or being written is finished first (a short
  command, or a signal held back during the imports, would otherwise end before it)."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline and (
      _dumping.is_set() or select.select([read_end], [], [], 0)[0]):
    time.sleep(0.05)


def _drain(read_end: int) -> None:
  """The reader thread: one dump per signal (or per burst of signals)."""
  while True:
    chunk = os.read(read_end, 1 << 16)
    if not chunk:
      return
    _dumping.set()
    chunks = [chunk]
    while select.select([read_end], [], [], _SETTLE_SECONDS)[0]:
      chunks.append(os.read(read_end, 1 << 16))
    try:
      where = dump_or_print(_folder, f"SIGUSR1 (kill -USR1 {os.getpid()})",
                            b"".join(chunks).decode("utf-8", "replace"))
      warn(f"SIGUSR1: stacks of every thread written to {where}")
    except Exception as e:  # pylint: disable=broad-except
      # A dump must never end the process it is meant to explain.
      warn(f"SIGUSR1: the stack dump failed ({type(e).__name__}: {e})")
    finally:
      _dumping.clear()
