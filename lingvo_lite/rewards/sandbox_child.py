"""The program `sandbox.run_program` starts: it runs untrusted Python in this process, fenced.

Run as `python -I -S sandbox_child.py` (no site-packages, no environment variables, no
current folder on the path) in a temporary folder of its own, with a JSON request in it
(`request.json`, removed once read: it holds the token):
`{"source", "token", "memory_bytes", "cpu_s", "file_bytes", "network_namespace"}`. It imports
the standard library alone (nothing of lingvo_lite: it must start in milliseconds and depend on
nothing the untrusted code could reach), then, before the untrusted code runs:

1. stdin, stdout and stderr go to /dev/null: the program's prints go nowhere, and the result is
   written to a descriptor of its own (the folder's result file, opened by the parent).
2. With `network_namespace`, a new user and network namespace (unshare(2)): the kernel gives
   the process no network interface but a loopback of its own that is down, so no socket
   reaches anything, whatever the code does; and root's capabilities stop at the namespace,
   so the limits below cannot be raised again. Where the kernel refuses (a container without
   user namespaces) the process goes on with the fence of step 4 alone, and says so in its
   result.
3. Resource limits (setrlimit): address space and data (`memory_bytes`: an unbounded
   allocation gets MemoryError or is killed), CPU seconds (`cpu_s`: SIGXCPU ends a busy loop
   even if the parent's wall clock failed), file size (`file_bytes`), no core dumps, 64
   descriptors.
4. An audit hook (PEP 578; it cannot be removed once added) refuses: creating, connecting or
   resolving any socket; starting processes (fork, exec, spawn, system, Popen, and importing
   `_posixsubprocess`, whose fork_exec is not audited); ctypes (every ctypes event, and
   importing `_ctypes`: raw system calls); signalling other processes; raising limits again;
   writing, truncating, creating, removing or renaming a file outside the folder, a database
   outside it, opening any folder (the "open" event does not say `dir_fd`, so a folder's
   descriptor would let a relative path mean another place), links, and more than
   `_MAX_WRITABLE_OPENS` files opened for writing (with the file size limit, a bound on what
   it can put on the disk). What creates files with no audit event is fenced too:
   `mkfifo` and `mknod` are replaced, and the C modules `_dbm`, `_gdbm` and `_posixshmem`
   (shared memory that outlives the process), and `posix` again, cannot be imported. The refusal is a PermissionError, so the program fails and scores 0.
   Reading is not fenced: the program may read what the training process may, but it has no
   way to send it anywhere but its own pass or fail.

The result file gets `passed <token>` only after the program (the completion and its tests)
ran to its end without raising: a program that exits early (`sys.exit(0)`, `os._exit(0)`), is
killed, or writes into the file itself does not pass unless it found the token in this
process's memory. That is the line between an accident and an attack: these fences keep a
completion from harming the machine or the training process, but code written to cheat its
tests from inside the same interpreter (reading the token from a frame, redefining `==` on
what it returns) is not stopped here, as it is not in HumanEval's runner.
"""

import json
import os
import resource
import sys

# Events refused outright (the audit event names of Python 3.11: docs "Audit events table").
_REFUSED = frozenset((
    "os.system", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn",
    "os.startfile", "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg",
    "signal.pthread_kill", "resource.setrlimit", "resource.prlimit", "os.link", "os.symlink",
    "os.chown", "os.chflags", "os.setxattr", "os.removexattr", "shutil.rmtree",
    "shutil.move", "shutil.chown", "webbrowser.open", "sys.remote_exec"))
# Events that change files, allowed inside the folder alone: event -> (positions of its paths,
# positions of its directory descriptors, which must be unset).
_INSIDE_ONLY = {"os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)),
                "os.rename": ((0, 1), (2, 3)), "os.mkdir": ((0,), (2,)),
                "os.chmod": ((0,), (2,)), "os.utime": ((0,), (3,)), "os.truncate": ((0,), ())}
_REFUSED_PREFIXES = ("socket.", "ctypes.", "ssl.", "_ssl.")
# `_dbm` and `_gdbm` write files from C with no audit event, `_posixshmem` makes shared memory
# that outlives the process (in /dev/shm); `posix` imported again would bring back the
# functions `_fence_unaudited` replaced.
_REFUSED_IMPORTS = frozenset(("_posixsubprocess", "_ctypes", "ctypes", "_dbm", "_gdbm",
                              "_posixshmem", "posix"))
# Functions that create files with no audit event (a FIFO where the trainer opens a file would
# hang it), replaced in `os` and `posix` alike.
_UNAUDITED = ("mkfifo", "mknod")
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# Files opened for writing, at most: with the file size limit, what a program can put on the
# disk (64 x 1 MiB by default), since no audit event counts the bytes written.
_MAX_WRITABLE_OPENS = 64
_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000


def _inside(path, folder):
  try:
    real = os.path.realpath(os.fsdecode(path))
  except (TypeError, ValueError):
    return False
  return real == folder or real.startswith(folder + os.sep)


def _open_allowed(path, mode, flags, folder):
  """Reading any file; writing one inside `folder`; never a descriptor of a folder.

  The audit event does not carry `dir_fd`, so a folder's descriptor (which would make a checked
  relative path mean another place) is never handed out: `os.open` (mode None) of a folder is
  refused. The built-in `open` (mode a string) of a folder either fails (EISDIR) or hands the
  opening to its `opener`, whose own `os.open` is checked (tempfile names the folder so).
  """
  if isinstance(path, int):
    return True  # A descriptor already open: one this process was given, or opened here.
  writes = _writes(mode, flags)
  tmpfile = getattr(os, "O_TMPFILE", 0)
  if tmpfile and isinstance(flags, int) and flags & tmpfile == tmpfile:
    return _inside(path, folder)  # A nameless file in the folder (tempfile's), not a folder.
  try:
    is_folder = os.path.isdir(os.fsdecode(path)) or (
        mode is None and isinstance(flags, int) and flags & os.O_DIRECTORY)
  except (TypeError, ValueError):
    return False
  if is_folder and mode is None:
    return False
  return not writes or _inside(path, folder)


def _changes_inside(event, args, folder):
  """Whether a file-changing event (`_INSIDE_ONLY`) touches only paths inside `folder`."""
  paths, descriptors = _INSIDE_ONLY[event]
  if any(args[i] not in (None, -1) for i in descriptors if i < len(args)):
    return False
  return all(isinstance(args[i], int) and event == "os.truncate" or (
      isinstance(args[i], (str, bytes, os.PathLike)) and _inside(args[i], folder))
             for i in paths)


def _writes(mode, flags):
  return (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(
      isinstance(flags, int) and flags & _WRITES)


def _guard(folder):
  """The audit hook of step 4 (module doc) for the sandbox folder `folder`."""
  refused, prefixes, imports = _REFUSED, _REFUSED_PREFIXES, _REFUSED_IMPORTS
  writable_opens = [0]

  def hook(event, args):
    if event == "open":
      if not _open_allowed(args[0], args[1], args[2], folder):
        raise PermissionError(f"sandbox: opening {args[0]!r} (mode {args[1] or args[2]}): a "
                              "folder, or writing outside the sandbox folder, is refused")
      if not isinstance(args[0], int) and _writes(args[1], args[2]):
        writable_opens[0] += 1
        if writable_opens[0] > _MAX_WRITABLE_OPENS:
          raise PermissionError(f"sandbox: more than {_MAX_WRITABLE_OPENS} files opened for "
                                "writing is refused")
      return
    if event == "import":
      if args[0] in imports:
        raise PermissionError(f"sandbox: importing {args[0]} is refused")
      return
    if event in _INSIDE_ONLY:
      if not _changes_inside(event, args, folder):
        raise PermissionError(f"sandbox: {event} outside the sandbox folder is refused")
      return
    if event == "sqlite3.connect" and args[0] not in (":memory:", b":memory:", "") and not (
        isinstance(args[0], (str, bytes, os.PathLike)) and _inside(args[0], folder)):
      raise PermissionError("sandbox: a database outside the sandbox folder is refused")
    if event in refused or event.startswith(prefixes):
      raise PermissionError(f"sandbox: {event} is refused")

  return hook


def _fence_unaudited():
  """Replaces the file-creating functions no audit event covers (`_UNAUDITED`)."""
  import posix  # pylint: disable=g-import-not-at-top

  def refused(*args, **kwargs):
    raise PermissionError("sandbox: creating a FIFO or a device node is refused")

  for name in _UNAUDITED:
    for module in (os, posix):
      if hasattr(module, name):
        setattr(module, name, refused)


def _unshare():
  """Step 2 (module doc); returns '' or why the kernel refused."""
  import ctypes  # pylint: disable=g-import-not-at-top
  libc = ctypes.CDLL(None, use_errno=True)
  failed = libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0
  why = os.strerror(ctypes.get_errno()) if failed else ""
  # Gone before the untrusted code runs: it reaches ctypes only by importing it again, which
  # the hook refuses.
  for name in [name for name in sys.modules if name == "ctypes" or name.startswith(
      ("ctypes.", "_ctypes"))]:
    del sys.modules[name]
  return why


def _limit(request):
  memory, cpu, file_bytes = request["memory_bytes"], request["cpu_s"], request["file_bytes"]
  for which, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_DATA, memory),
                       (resource.RLIMIT_CPU, cpu), (resource.RLIMIT_FSIZE, file_bytes),
                       (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NOFILE, 64)):
    resource.setrlimit(which, (value, value))


def _reason(error):
  try:
    text = str(error)
  except Exception:  # pylint: disable=broad-except
    text = ""
  text = " ".join(text.split())[:200]
  return f"{type(error).__name__}: {text}" if text else type(error).__name__


def main():
  with open("request.json", "rb") as f:
    request = json.loads(f.read())
  os.remove("request.json")  # It holds the token.
  result = os.open("result", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
  null = os.open(os.devnull, os.O_RDWR)
  for fd in (0, 1, 2):
    os.dup2(null, fd)
  note = _unshare() if request["network_namespace"] else ""
  _limit(request)
  folder = os.path.realpath(os.getcwd())
  _fence_unaudited()
  sys.addaudithook(_guard(folder))
  write, leave, token, source = os.write, os._exit, request["token"], request["source"]
  del request
  note = f" (no network namespace: {note})" if note else ""
  try:
    exec(compile(source, "<program>", "exec"), {"__name__": "__main__"})  # pylint: disable=exec-used
  except BaseException as e:  # pylint: disable=broad-except
    write(result, f"failed: {_reason(e)}{note}".encode("utf-8", "backslashreplace"))
    leave(1)
  write(result, f"passed {token}".encode())
  leave(0)


if __name__ == "__main__":
  main()
