"""One training run per job directory: an exclusive lock held for the whole run.

Two trainers in one job dir would interleave checkpoints and metric rows and each delete the
other's "incomplete" steps. So a training run takes `JOB/.lingvo_lite.lock` first: an
`fcntl.flock` on that file, with the holder's host, pid, start time and command line written
in it for whoever is refused. The kernel drops a flock when its process dies, even by
`kill -9`, so the lock never outlives its run: a file left behind only names a holder that is
gone, and the next run takes it over with one warning. On release the file is unlinked while
still locked, and a job dir the lock itself created is removed again if the run left it
empty, so a run that fails at once leaves the file system as it was.

What it protects: local job dirs on one host, and network file systems whose flock reaches
every client (Linux NFS maps flock to NFS byte-range locks; a `nolock` mount keeps them per
host). A file system that refuses flock gets one warning and an unprotected run. Remote URLs
(`gs://...`) are not protected at all: object stores have no locks, so the caller passes
`enabled=False` for them (and this class ignores `enabled` for them anyway). In a
multi-process run only process 0 holds the lock, for the whole run.

The lock is a local-file-system object by nature (flock needs a file descriptor), so this one
module works on `os` file descriptors rather than through etils.epath.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket
import sys
import time

from absl import logging
from etils import epath

from lingvo_lite import input_files, paths
from lingvo_lite.errors import UsageError

LOCK_NAME = ".lingvo_lite.lock"

# flock's errors for "this file system cannot lock" (as opposed to "someone holds it").
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)


class JobLock:
  """Context manager: exclusive use of `job_dir` by this process while the block runs.

  Entering creates `job_dir` if missing and takes the lock, or raises `UsageError` naming the
  live holder; leaving releases it and removes the folders it created, if left empty.

  Args:
    job_dir: The resolved job dir (absolute local path, or a URL).
    enabled: False makes this a no-op: processes other than 0, and remote job dirs.
    shown: The job dir as the user wrote it, for messages (default: `job_dir`).
    run_kind: What holds the lock, for messages: "training" (JOB itself), or "eval" (the
      eval program's lock on JOB/eval, which leaves the trainer's alone).
  """

  def __init__(self, job_dir: epath.Path, enabled: bool, shown: str | None = None,
               run_kind: str = "training"):
    self._job_dir = job_dir
    self._run_kind = run_kind
    self._enabled = enabled and not paths.is_remote(str(job_dir))
    self._flag = f"--job_log_dir={shown if shown is not None else job_dir}"
    self._path = os.path.join(os.fspath(job_dir), LOCK_NAME)
    self._fd: int | None = None
    self._created: list[str] = []  # Folders that did not exist before, deepest first.

  def __enter__(self) -> JobLock:
    if not self._enabled:
      return self
    folder = os.fspath(self._job_dir)
    while not os.path.exists(folder):
      self._created.append(folder)
      folder = os.path.dirname(folder)
    try:
      self._acquire()
    except BaseException:
      self._remove_created_folders()
      raise
    return self

  def __exit__(self, *exc) -> None:
    if self._fd is not None:
      # Unlinked while still held: a run that opens the path after this gets a new file, and
      # one that opened the old file sees it unlinked (inode check) and opens again.
      try:
        os.unlink(self._path)
      except FileNotFoundError:
        pass
      os.close(self._fd)
      self._fd = None
    self._remove_created_folders()

  def _acquire(self) -> None:
    for _ in range(100):  # Each retry means another run released the lock meanwhile.
      os.makedirs(self._job_dir, exist_ok=True)  # Again: a releasing run may have removed it.
      try:
        fd = _open(self._path)
      except FileNotFoundError:
        continue
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        holder = _read_holder(fd, wait=True)
        os.close(fd)
        raise UsageError(f"{self._flag}: in use by another {self._run_kind} run "
                         f"({_describe(holder)}); "
                         "wait for it to finish or stop it, or use another --job_log_dir")
      except OSError as e:
        if e.errno not in _UNSUPPORTED:
          os.close(fd)
          raise
        logging.warning("%s: this file system cannot lock %s (%s); running without the "
                        "one-trainer-per-job-dir check: make sure no other run uses this job dir",
                        self._flag, self._path, os.strerror(e.errno))
        os.close(fd)
        self._unlink_if_empty()
        return
      if not _names_same_file(fd, self._path):
        os.close(fd)  # The holder released (unlinked) it between our open and flock.
        continue
      self._fd = fd
      break
    else:
      raise UsageError(f"{self._flag}: could not lock {self._path}: it kept being replaced by "
                       "other runs; let them finish, or use another --job_log_dir")
    previous = _read_holder(fd, wait=False)
    if previous:
      logging.warning("%s: taking over the lock file of a %s run that is gone (%s)",
                      self._flag, self._run_kind, _describe(previous))
    info = {"host": socket.gethostname(), "pid": os.getpid(),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"),
            "argv": sys.argv}
    try:
      os.ftruncate(fd, 0)
      os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    except OSError:
      pass  # Another user's file, opened read-only: locked all the same, just not described.

  def _unlink_if_empty(self) -> None:
    try:
      if os.path.getsize(self._path) == 0:
        os.unlink(self._path)
    except OSError:
      pass

  def _remove_created_folders(self) -> None:
    for folder in self._created:
      try:
        os.rmdir(folder)  # Only if empty: anything the run wrote stays.
      except OSError:
        break
    self._created = []


def _open(path: str) -> int:
  try:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
  except PermissionError:
    # Left by another user: flock works on a read-only descriptor too.
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def _names_same_file(fd: int, path: str) -> bool:
  try:
    current = os.stat(path)
  except FileNotFoundError:
    return False
  opened = os.fstat(fd)
  return (opened.st_dev, opened.st_ino) == (current.st_dev, current.st_ino)


def _read_holder(fd: int, wait: bool) -> dict | None:
  """The holder's info; a holder that has just taken the lock may not have written it yet."""
  for _ in range(20 if wait else 1):
    text = os.pread(fd, 1 << 16, 0).decode(errors="replace").strip()
    if text:
      try:
        holder = input_files.json_value(text)
        return holder if isinstance(holder, dict) else {}
      except ValueError:
        return {}
    if wait:
      time.sleep(0.05)
  return None


def _describe(holder: dict | None) -> str:
  """`pid 1234 on host h, started 2026-12-01 09:58:03 UTC`, as much of it as is known."""
  if not holder:
    return "its details are not written yet" if holder is None else "its details are unreadable"
  parts = [f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"]
  started = holder.get("started")
  if isinstance(started, str):
    try:
      started = datetime.datetime.fromisoformat(started).astimezone(
          datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except ValueError:
      pass
    parts.append(f"started {started}")
  return ", ".join(parts)
