"""A small disk to fill up, for the full-disk tests and `bench/disk_full_sweep.py`.

A file size limit (RLIMIT_FSIZE) is not a full disk: it fails one file's growth with EFBIG,
where a full disk fails every allocation, a rename's new directory entry included, with
ENOSPC. So this mounts a real tmpfs of a given size: directly where this process is root,
else in a user and mount namespace of its own (`unshare --user --map-root-user --mount`), held
open by a sleeping process. Commands then run inside that namespace (`command` puts `nsenter`
before them), and this process reaches the disk's files through `/proc/PID/root`; the disk
goes when the holder does.
"""

from __future__ import annotations

import errno
import os
import pathlib
import shutil
import signal
import subprocess
from typing import Sequence

PAGE = 4096  # tmpfs counts its size in pages.
_FILLER = "filler"


class Unavailable(Exception):
  """No tmpfs can be mounted here (not root, and no unprivileged user namespaces)."""


class SmallDisk:
  """A tmpfs of `size` (mount's spelling: `4200k`, `64m`) at the folder `folder`.

  Attributes:
    path: Where this process reads and writes the disk's files.
  """

  def __init__(self, folder: str | os.PathLike, size: str):
    self._folder = os.path.abspath(folder)
    self._holder: subprocess.Popen | None = None
    os.makedirs(self._folder, exist_ok=True)
    problems = []
    if os.geteuid() == 0:
      mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                                self._folder], capture_output=True, text=True, check=False)
      if mounted.returncode == 0:
        self.path = pathlib.Path(self._folder)
        return
      problems.append(f"mount as root: {mounted.stderr.strip()}")
    if shutil.which("unshare") and shutil.which("nsenter"):
      self._holder = subprocess.Popen(
          ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private", "sh",
           "-c", 'mount -t tmpfs -o size="$1" tmpfs "$0" && echo mounted && '
           # Gone with this process, however it ends (setpriv: where util-linux has it).
           'if setpriv --pdeathsig KILL true 2>/dev/null; then '
           'exec setpriv --pdeathsig KILL sleep 86400; else exec sleep 86400; fi',
           self._folder, size], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      if self._holder.stdout.readline().strip() == "mounted":
        self.path = pathlib.Path(f"/proc/{self._holder.pid}/root{self._folder}")
        return
      self._holder.wait(timeout=30)
      problems.append(f"unshare --user --map-root-user --mount: "
                      f"{self._holder.stderr.read().strip() or 'failed'}")
      self._holder.stdout.close()
      self._holder.stderr.close()
      self._holder = None
    else:
      problems.append("no unshare/nsenter to mount one in a user namespace")
    raise Unavailable("cannot mount a small tmpfs here (" + "; ".join(problems) + ")")

  def command(self, argv: Sequence[str]) -> list[str]:
    """`argv` as run where the disk is mounted."""
    if self._holder is None:
      return list(argv)
    # Our own uid is root in there; nsenter's setgroups() is refused where it is not.
    return ["nsenter", f"--target={self._holder.pid}", "--user", "--mount",
            "--preserve-credentials", *argv]

  def resize(self, size: str) -> None:
    subprocess.run(self.command(["mount", "-t", "tmpfs", "-o", f"remount,size={size}", "tmpfs",
                                 self._folder]), check=True, capture_output=True)

  def free_pages(self) -> int:
    stat = os.statvfs(self.path)
    return stat.f_bavail * stat.f_frsize // PAGE

  def used_pages(self) -> int:
    stat = os.statvfs(self.path)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize // PAGE

  def fill(self, free_pages: int = 0) -> None:
    """Fills the disk with a file of its own (outside any job's folder), leaving exactly
    `free_pages` pages free."""
    filler = self.path / _FILLER
    descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
      for chunk in (b"\0" * (256 * PAGE), b"\0" * PAGE):
        while True:
          try:
            if os.write(descriptor, chunk) < len(chunk):
              break
          except OSError as e:
            if e.errno != errno.ENOSPC:
              raise
            break
      length = os.fstat(descriptor).st_size // PAGE * PAGE
      os.ftruncate(descriptor, max(length - free_pages * PAGE, 0))
    finally:
      os.close(descriptor)

  def unfill(self) -> None:
    (self.path / _FILLER).unlink(missing_ok=True)

  def close(self) -> None:
    if self._holder is not None:
      self._holder.send_signal(signal.SIGKILL)
      self._holder.wait(timeout=30)
      self._holder.stdout.close()  # Its pipes: else each is an unclosed file at collection.
      self._holder.stderr.close()
      self._holder = None
    else:
      subprocess.run(["umount", "-l", self._folder], check=False, capture_output=True)

  def __enter__(self) -> SmallDisk:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def for_test(folder: str | os.PathLike, size: str) -> SmallDisk:
  """A SmallDisk for a pytest test, or the test skipped with the reason where this machine
  can mount none (neither root nor user namespaces)."""
  import pytest  # pylint: disable=g-import-not-at-top  # Tests only; the bench does without.
  try:
    return SmallDisk(folder, size)
  except Unavailable as e:
    pytest.skip(str(e))
