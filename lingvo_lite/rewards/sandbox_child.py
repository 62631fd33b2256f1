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
   writing, truncating or creating a file outside the folder, opening a folder outside it
   (whose descriptor would let a relative path escape), and removing, renaming or re-linking
   any file. The refusal is a PermissionError, so the program fails and scores 0.

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
    "signal.pthread_kill", "resource.setrlimit", "resource.prlimit", "os.remove",
    "os.rmdir", "os.rename", "os.link", "os.symlink", "os.chmod", "os.chown", "os.chflags",
    "os.truncate", "os.utime", "os.setxattr", "os.removexattr", "shutil.rmtree",
    "shutil.move", "shutil.chown", "webbrowser.open", "sys.remote_exec"))
_REFUSED_PREFIXES = ("socket.", "ctypes.", "ssl.", "_ssl.")
_REFUSED_IMPORTS = frozenset(("_posixsubprocess", "_ctypes", "ctypes"))
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000


def _inside(path, folder):
  try:
    real = os.path.realpath(os.fsdecode(path))
  except (TypeError, ValueError):
    return False
  return real == folder or real.startswith(folder + os.sep)


def _open_allowed(path, mode, flags, folder):
  if isinstance(path, int):
    return True  # A descriptor already open: one this process was given, or opened here.
  writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
      isinstance(flags, int) and flags & _WRITES)
  if _inside(path, folder):
    return True
  try:
    is_folder = os.path.isdir(os.fsdecode(path))
  except (TypeError, ValueError):
    return False
  return not writes and not is_folder


def _guard(folder):
  """The audit hook of step 4 (module doc) for the sandbox folder `folder`."""
  refused, prefixes, imports = _REFUSED, _REFUSED_PREFIXES, _REFUSED_IMPORTS

  def hook(event, args):
    if event == "open":
      if not _open_allowed(args[0], args[1], args[2], folder):
        raise PermissionError(f"sandbox: opening {args[0]!r} for {args[1] or 'writing'} "
                              "outside the sandbox folder is refused")
      return
    if event == "import":
      if args[0] in imports:
        raise PermissionError(f"sandbox: importing {args[0]} is refused")
      return
    if event == "os.mkdir" and not _inside(args[0], folder):
      raise PermissionError("sandbox: creating a folder outside the sandbox folder is refused")
    if event in refused or event.startswith(prefixes):
      raise PermissionError(f"sandbox: {event} is refused")

  return hook


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
